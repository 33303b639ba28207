"""RewardModelWorker: a reward model (HF sequence classifier) on this rank's device.

Hosted inside `HybridWorker` (colocated: every actor rank holds a copy and scores its
share of the texts) or as one Ray worker per rank of its own pool (split placement: the
driver hands each worker a share). No torch.distributed inside: scoring is per text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl_mp.config.schema import RootConfig
from verl_mp.engine.runtime import local_device
from verl_mp.reward.reward_model import SequenceScorer
from verl_mp.utils.dtypes import TORCH_DTYPES


class RewardModelWorker:
    def __init__(self, cfg: RootConfig):
        rm = cfg.reward_model
        self.scorer = SequenceScorer.from_pretrained(rm.path, dtype=TORCH_DTYPES[rm.dtype], device=local_device(),
                                                     max_length=rm.max_length, batch_size=rm.micro_batch_size)

    def score(self, texts: Sequence[str]) -> torch.Tensor:
        """float32 [len(texts)] on the CPU."""
        return self.scorer.score(texts)

    def close(self) -> None:
        """Nothing outlives this worker's process."""


def shard(items: Sequence, rank: int, world: int) -> list:
    """Rank ``rank``'s contiguous share of ``items`` (sizes differ by at most one); the
    shares of ranks 0..world-1, concatenated, are ``items`` in order."""
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start:start + base + (rank < extra)])
