"""Device memory per phase, for the step's metrics (GPU only; empty on CPU), and the peak
tensor memory of one call measured on real tensors (`peak_allocated_bytes`, CPU and GPU).

``memory/<phase>/<when>_{allocated,reserved,free}_gib``: what PyTorch's caching allocator
holds for tensors (allocated), what it holds in all (reserved: allocated plus cached
blocks), and what the device has free (other allocators included: vLLM's KV cache and
weights live outside PyTorch's caching allocator). The peak of the phase is
``memory/<phase>/peak_allocated_gib``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

GIB = 2**30


def _allocator_bytes() -> dict[str, int]:
    """The caching allocator's counters from one read of its statistics. (``memory_allocated()``,
    ``memory_reserved()`` and ``max_memory_allocated()`` each flatten all of them in Python:
    ~80 us a call on the H200 host, against 13.5 us for the driver's free memory; 2026-12-03.)"""
    stats = torch.cuda.memory_stats_as_nested_dict()

    def read(kind: str, which: str) -> int:  # 0 before CUDA starts, as torch.cuda.memory_allocated()
        return stats.get(kind, {}).get("all", {}).get(which, 0)

    return {"allocated": read("allocated_bytes", "current"), "reserved": read("reserved_bytes", "current"),
            "peak": read("allocated_bytes", "peak")}


def snapshot(phase: str, when: str, counters: dict[str, int] | None = None) -> dict[str, float]:
    """``memory/<phase>/<when>_*`` now (``counters``: `_allocator_bytes`, if just read)."""
    if not torch.cuda.is_available():
        return {}
    counters = counters or _allocator_bytes()
    free, _ = torch.cuda.mem_get_info()
    prefix = f"memory/{phase}/{when}"
    return {f"{prefix}_allocated_gib": counters["allocated"] / GIB,
            f"{prefix}_reserved_gib": counters["reserved"] / GIB,
            f"{prefix}_free_gib": free / GIB}


@contextmanager
def tracked(phase: str, metrics: dict[str, float]):
    """Record the memory before and after the block, and its peak allocation, in ``metrics``.
    The block's queued device work finishes inside it: a phase's kernels (the optimizer step's
    tail, say) are its own time, not the next phase's, and the readings after are settled."""
    if not torch.cuda.is_available():
        yield
        return
    metrics.update(snapshot(phase, "before"))
    torch.cuda.reset_peak_memory_stats()
    yield
    torch.cuda.synchronize()
    after = _allocator_bytes()
    metrics[f"memory/{phase}/peak_allocated_gib"] = after["peak"] / GIB
    metrics.update(snapshot(phase, "after", after))


def peak_allocated_bytes(fn: Callable[[], Any]) -> int:
    """The most tensor memory ``fn()`` held at once beyond what was live when it started,
    measured on real tensors (not on anyone's own bookkeeping).

    CUDA: the caching allocator's peak statistic. CPU (no allocator statistics there, and the
    profiler misses frees on other threads, e.g. gloo's): every storage an aten op creates
    inside ``fn`` (`_LiveStorages`) counts from its creation until it is freed, whichever
    thread frees it. Not seen on CPU: buffers C++ code allocates and frees internally
    (gloo's flattened all-gather output), and memory of other allocators (vLLM's).
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start
    with _LiveStorages() as live:
        fn()
    return live.peak_bytes


class _LiveStorages(TorchDispatchMode):
    """Live bytes of the storages that ops create while the mode is on: an op's output
    whose storage is none of its inputs' is new; a finalizer on the storage (PyTorch keeps
    one Python object per storage) subtracts its bytes when the storage dies."""

    def __init__(self):
        super().__init__()
        self.live_bytes = self.peak_bytes = 0
        self._lock = threading.Lock()

    def _freed(self, nbytes: int) -> None:
        with self._lock:
            self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if id(storage) in inputs or getattr(storage, "_verl_mp_counted", False):
                continue
            storage._verl_mp_counted = True
            nbytes = storage.nbytes()
            weakref.finalize(storage, self._freed, nbytes)
            with self._lock:
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out
