"""WorkerGroups: the driver's one handle on the processes, one named method per phase.

A group is a set of processes that each hold a `RankWorker` for the same roles: a
`RayWorkerGroup` (one Ray actor per rank, `verl_mp.workers.ray_group`) or, under torchrun,
a `LocalGroup` (this process's own worker: every rank runs the loop and makes the same
calls). `WorkerGroups` sends each phase to the groups that host its roles, concurrently,
and waits for all of them: one round trip per phase, counted for the step's metrics
(``perf/driver_round_trips``, and the tensor bytes sent, ``perf/driver_sent_mb`` and per
phase ``perf/driver_sent_mb/<phase>``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl_mp.config.profile import ProfileConfig
from verl_mp.data.rl_batch import RLBatch
from verl_mp.plan import RunPlan
from verl_mp.workers.protocol import ForwardRequest, ForwardResult, RLWorker, UpdateRequest

logger = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """A rank failed inside a worker call; the message names the group, rank and phase."""


class LocalGroup:
    """This process's `RankWorker` (torchrun SPMD): calls run in place."""

    def __init__(self, worker):
        self.worker = worker
        self.name = worker.group

    def submit(self, method, *args):
        try:
            return getattr(self.worker, method.__name__)(*args)
        except BaseException as err:
            err.add_note(f"(worker group {self.name}, call {method.__name__})")
            raise

    def result(self, handle):
        return handle

    def shutdown(self) -> None:
        self.worker.close()


class WorkerGroups:
    def __init__(self, plan: RunPlan, groups: dict[str, Any]):
        self.plan, self.groups = plan, groups
        self.round_trips = 0
        self.sent_bytes: dict[str, int] = {}
        """Tensor bytes sent per phase (method) since the last `step_counters`."""

    # -- phases --------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling, record_routing: bool = False, carry=None):
        return self.wait(self.submit_generate(prompt_ids, sampling, record_routing, carry))

    def submit_generate(self, prompt_ids: list[list[int]], sampling, record_routing: bool = False,
                        carry=None) -> PendingCall:
        """Start a generation and return at once (a rollout on its own pool generates while
        the actor's group trains); `wait` gives its `RolloutOutput`. Calls reach a group's
        ranks in the order they were made. ``record_routing``: with each sequence's routed
        experts (mixture of experts, ``actor.router_replay=rollout``). ``carry``: a
        `CarryRequest` (multi-turn carry-over)."""
        return self._submit(["rollout"], RLWorker.generate, prompt_ids, sampling, record_routing, carry)

    def wait(self, pending: PendingCall):
        """The result of a submitted call (rank 0's of its first group)."""
        return self._collect(pending)[0]

    def score(self, texts: list[str]) -> torch.Tensor:
        return self._call(["reward_model"], RLWorker.score, texts)[0]

    def forward(self, batch: RLBatch, request: ForwardRequest) -> ForwardResult:
        results = self._call(request.roles(), RLWorker.forward, batch, request)
        merged = results[0]
        for r in results[1:]:
            merged = merged.merge(r)
        return merged

    def update(self, batch: RLBatch, request: UpdateRequest) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for part in self._call(request.roles(), RLWorker.update, batch, request):
            metrics.update(part)
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """Actor -> rollout. Colocated: one call; a rollout on its own pool: the actor's group
        sends and the rollout's receives, concurrently (one round trip)."""
        metrics: dict[str, float] = {}
        for part in self._call(["actor", "rollout"], RLWorker.sync_weights):
            metrics.update(part)
        return metrics

    def open_weight_channel(self) -> None:
        """Connect the actor's group to a rollout on a pool of its own (start-up; a no-op
        when the rollout is colocated): the actor's rank 0 reserves the channel's address."""
        if not self.plan.rollout_apart:
            return
        host, port = self.groups[self.plan.group_of("actor")].reserve_address()
        self._call(["actor", "rollout"], RLWorker.open_weight_channel, host, port)

    # -- run state -----------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        self._call([r for r in ("actor", "critic") if self.plan.has(r)], RLWorker.save_checkpoint, directory)

    def load_checkpoint(self, directory: str) -> None:
        self._call([r for r in ("actor", "critic") if self.plan.has(r)], RLWorker.load_checkpoint, directory)

    def export_hf(self, directory: str) -> None:
        self._call(["actor"], RLWorker.export_hf, directory)

    def start_profile(self, directory: str, settings: ProfileConfig) -> None:
        """Open a profiling session on every group (`trainer.profile`; not counted as a round
        trip of the step: it is not part of the step's work)."""
        self._everywhere(RLWorker.start_profile, directory, settings)

    def stop_profile(self) -> dict[str, dict | None]:
        """Close it; each group's rank-0 phases summary, by group name."""
        return self._everywhere(RLWorker.stop_profile)

    def _everywhere(self, method, *args) -> dict:
        names = list(self.groups)
        handles = [self.groups[n].submit(method, *args) for n in names]
        return {n: self.groups[n].result(h) for n, h in zip(names, handles, strict=True)}

    def describe(self) -> dict[str, dict]:
        """Each group's `RankWorker.describe` (rank 0's), by group name."""
        return self._everywhere(RLWorker.describe)

    def step_counters(self) -> dict[str, float]:
        """Round trips and tensor bytes sent since the last call (then reset)."""
        out = {"perf/driver_round_trips": float(self.round_trips),
               "perf/driver_sent_mb": sum(self.sent_bytes.values()) / 2**20}
        out.update({f"perf/driver_sent_mb/{name}": b / 2**20 for name, b in self.sent_bytes.items()})
        self.round_trips, self.sent_bytes = 0, {}
        return out

    def shutdown(self, at_once: bool = False) -> None:
        """``at_once``: without letting the ranks close first (a second Ctrl-C; what they leave
        is swept by the driver)."""
        for group in self.groups.values():
            if at_once:
                group.shutdown(close_timeout_s=0.0)
            else:
                group.shutdown()

    # -- fan-out -------------------------------------------------------------------------------
    def _call(self, roles: list[str], method, *args) -> list:
        """``method(*args)`` on every group hosting one of ``roles``, concurrently; their
        results (rank 0's of each group) in group order. One round trip."""
        return self._collect(self._submit(roles, method, *args))

    def _submit(self, roles: list[str], method, *args) -> PendingCall:
        names = sorted({self.plan.group_of(r) for r in roles}, key=list(self.groups).index)
        self.round_trips += 1
        name = method.__name__
        self.sent_bytes[name] = self.sent_bytes.get(name, 0) + len(names) * _tensor_bytes(args)
        return PendingCall([(n, self.groups[n].submit(method, *args)) for n in names])

    def _collect(self, pending: PendingCall) -> list:
        return [self.groups[n].result(h) for n, h in pending.handles]


class PendingCall:
    """A call submitted to one or more groups (`WorkerGroups.submit_generate`)."""

    def __init__(self, handles: list[tuple[str, Any]]):
        self.handles = handles


def _tensor_bytes(obj) -> int:
    """Bytes of the tensors, numbers and strings in ``obj`` (an RLBatch, lists, tuples): about
    what a call ships (pickling adds a little)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, RLBatch):
        return sum(_tensor_bytes(v) for v in vars(obj).values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    if isinstance(obj, (int, float)):  # token ids of prompts
        return 8
    if isinstance(obj, str):
        return len(obj)
    return 0
