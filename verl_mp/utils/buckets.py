"""Greedy bucketing of a stream of tensors (the weight sync and the weight channel)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def pack_buckets(sizes: Sequence[int], limit: int,
                 joins: Callable[[int, int], bool] = lambda first, i: True) -> list[list[int]]:
    """Indices of ``sizes`` in order, cut into buckets of at most ``limit`` bytes (a larger
    item gets a bucket of its own); ``joins(first, i)``: item ``i`` may share a bucket whose
    first item is ``first``."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, nbytes in enumerate(sizes):
        if current and (size + nbytes > limit or not joins(current[0], i)):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
