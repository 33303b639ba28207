"""What a rollout backend returns, and the interface every backend implements."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from verl_mp.config.rollout import SamplingConfig


@dataclass(kw_only=True, slots=True)
class RolloutOutput:
    """Generated samples for a list of prompts, ``n`` per prompt, prompt-major order.

    ``response_ids[i]`` and ``response_logprobs[i]`` belong to prompt ``i // n``; the
    log-probs are those of the sampled tokens under the rollout policy (after temperature).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_logprobs: list[list[float]] | None
    """None when the sampling asked for none (``SamplingConfig.logprobs=False``)."""
    n: int
    finished: list[bool]
    """False where generation stopped at ``max_new_tokens`` (truncated)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What the worker measured around generation (memory per phase on GPUs)."""
    wall_start: float = 0.0
    wall_end: float = 0.0
    """Wall-clock times (``time.time()``) at which the worker began and finished generating:
    how long generation overlapped training, and each pool's idle time."""

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.prompt_ids) * self.n:
            raise ValueError("RolloutOutput: need n responses per prompt")
        for ids, lps in zip(self.response_ids, self.response_logprobs or self.response_ids, strict=True):
            if len(ids) != len(lps):
                raise ValueError("RolloutOutput: one log-prob per response token required")

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    def padded_logprobs(self, max_len: int | None = None) -> torch.Tensor | None:
        """Response log-probs as ``[B, T]`` float32, right-padded with 0 (None if not returned)."""
        if self.response_logprobs is None:
            return None
        max_len = max_len or max((len(r) for r in self.response_ids), default=0)
        out = torch.zeros(len(self.response_ids), max_len, dtype=torch.float32)
        for i, lps in enumerate(self.response_logprobs):
            out[i, : len(lps)] = torch.tensor(lps[:max_len], dtype=torch.float32)
        return out


class RolloutBackend(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> RolloutOutput: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights from HF-named full tensors, consumed lazily in order."""

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None:
        """Release what would outlive the process otherwise (e.g. shared memory)."""


def chain_weights(buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        yield from bucket
