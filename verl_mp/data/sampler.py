"""A seeded, epoch-aware batch sampler whose position can be saved and restored.

The order of epoch ``e`` is a pure function of ``(seed, e)``, so restoring
``{epoch, position, seed}`` from a checkpoint reproduces exactly the batches an
uninterrupted run would have produced next.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


class ResumableBatchSampler:
    """Yields batches of dataset indices, ``batch_size`` at a time.

    ``drop_last=True`` (the default, as RL steps want a fixed batch size): the last
    ``num_samples % batch_size`` indices of each epoch's order are not used that epoch;
    they differ per epoch when shuffling, so no sample is excluded for good.
    ``drop_last=False``: the last batch of an epoch may be smaller.

    Iterating yields the *remaining* batches of the current epoch and then moves to the
    next epoch, so ``for epoch ...: for batch in sampler`` works, and so does ``next_batch``
    for a step-driven loop. The position advances when a batch is handed out: a state
    saved after training on a batch resumes with the following batch.
    """

    def __init__(
        self, num_samples: int, batch_size: int, seed: int = 0, shuffle: bool = True,
        drop_last: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"data.batch_size={batch_size} must be >= 1")
        if num_samples < (batch_size if drop_last else 1):
            raise ValueError(
                f"{num_samples} samples cannot fill one batch of data.batch_size={batch_size} "
                "with drop_last=True. Fix: lower the batch size or add data."
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # batches already handed out in the current epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The permutation of sample indices used in ``epoch`` (identity if not shuffling)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.epoch_order(self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1
            yield order[start : start + self.batch_size].tolist()
        self.epoch += 1
        self.position = 0

    def next_batch(self) -> list[int]:
        """The next batch, rolling over into the next epoch when this one is used up."""
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        order = self.epoch_order(self.epoch)
        start = self.position * self.batch_size
        self.position += 1
        return order[start : start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the exact sequence of batches."""
        return {
            "epoch": self.epoch, "position": self.position, "seed": self.seed,
            "num_samples": self.num_samples, "batch_size": self.batch_size,
            "shuffle": self.shuffle, "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved position; the dataset and batch layout must be unchanged."""
        for key in ("num_samples", "batch_size", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler checkpoint has {key}={state[key]} but this run has "
                    f"{getattr(self, key)}; resuming would not reproduce the batch order. "
                    "Fix: resume with the same data files and data settings."
                )
        if state["seed"] != self.seed:
            logger.warning("sampler: resuming with the checkpoint's seed %s (config has %s)",
                           state["seed"], self.seed)
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
