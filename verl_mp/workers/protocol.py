"""The worker interface: what the driver loop asks of the processes, one call per phase.

Every process of a worker group holds a `RankWorker` (`verl_mp.workers.rank_worker`) and
runs the same method with the same arguments (the methods are collective inside the
group). The driver reaches them through `WorkerGroups` (`verl_mp.workers.groups`), which
fans each call out, explicitly, to the groups hosting the roles it needs. One step of
PPO is at most five such round trips (generate, score with a reward model, forward,
update, sync) and one of GRPO four, three where the forward phase has nothing to compute
(the old log-probs from the update, `actor.old_log_probs`, and no reference:
`perf/driver_round_trips` counts them).

Batches travel in the algorithm's layout (`verl_mp.data.rl_batch.RLBatch`, per-token
tensors ``[B, T]`` over response tokens); the worker converts them to the engines'
next-token layout ``[B, S]`` once per call (`verl_mp.workers.batch_io`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from verl_mp.config.profile import ProfileConfig
from verl_mp.config.rollout import SamplingConfig
from verl_mp.data.rl_batch import RLBatch
from verl_mp.rollout.types import CarryRequest, RolloutOutput


@dataclass(frozen=True)
class ForwardRequest:
    """What one forward phase computes (all from the same engine inputs)."""

    old_log_probs: bool = True
    """The actor's log-probs before the update."""
    ref_log_probs: bool = False
    values: bool = False

    def roles(self) -> list[str]:
        return [r for r, on in (("actor", self.old_log_probs), ("ref", self.ref_log_probs),
                                ("critic", self.values)) if on]


@dataclass
class ForwardResult:
    """``[B, T]`` fp32 per-token outputs on the CPU (None when not requested), and the
    workers' metrics (``timing/<phase>_s`` for each engine pass)."""

    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    routed_experts: torch.Tensor | None = None
    """``[B, S, L, k]``: the routing the old-log-prob pass recorded (``actor.router_replay=old_logprob``)."""
    metrics: dict[str, float] = field(default_factory=dict)

    def merge(self, other: ForwardResult) -> ForwardResult:
        """Combine the results of two groups (e.g. the actor's and a split critic's)."""
        pick = {n: getattr(self, n) if getattr(self, n) is not None else getattr(other, n)
                for n in ("old_log_probs", "ref_log_probs", "values", "routed_experts")}
        return ForwardResult(**pick, metrics={**self.metrics, **other.metrics})


@dataclass(frozen=True)
class UpdateRequest:
    """Which models train in one update phase (the critic first, then the actor)."""

    actor: bool = True
    critic: bool = False

    def roles(self) -> list[str]:
        return [r for r, on in (("critic", self.critic), ("actor", self.actor)) if on]


class RLWorker(Protocol):
    """The methods every `RankWorker` offers; a method a process has no role for raises."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 record_routing: bool = False, carry: CarryRequest | None = None) -> RolloutOutput:
        """Sample with the rollout engine; the actor's memory is handed over and back.
        ``record_routing``: with each sequence's routed experts (mixture of experts).
        ``carry``: multi-turn conversations carried over from the last generation, and how
        many prompt groups to complete (``rollout.multi_turn.carry_over``)."""

    def score(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts)]`` reward-model scores (each rank scores a share)."""

    def forward(self, batch: RLBatch, request: ForwardRequest) -> ForwardResult:
        """Old log-probs, reference log-probs and values of the hosted roles, in one pass
        over the batch."""

    def update(self, batch: RLBatch, request: UpdateRequest) -> dict[str, float]:
        """PPO epochs of the hosted critic and actor over ``batch``; reduced metrics."""

    def sync_weights(self) -> dict[str, float]:
        """Actor shards -> the rollout engine (with the rollout on its own pool: the actor's
        group sends, the rollout's group receives)."""

    def open_weight_channel(self, host: str, port: int) -> None:
        """Join the channel between the actor's rank 0 and a rollout on its own pool."""

    def save_checkpoint(self, directory: str) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def export_hf(self, directory: str) -> None: ...

    def start_profile(self, directory: str, settings: ProfileConfig) -> None:
        """Start torch.profiler in this process if its rank profiles (`trainer.profile`)."""

    def stop_profile(self) -> dict | None:
        """Stop it and write the files; the phases summary (None where nothing recorded)."""

    def describe(self) -> dict:
        """What this process hosts: its roles, the engine configs it received, its world
        size and the actor's FLOP parameter count."""

    def close(self) -> None:
        """Release what would outlive the process (shared memory); idempotent."""
