"""Where each step's generations come from: made when the step asks (on-policy), or up to
``trainer.off_policy_steps`` steps ahead while the actor trains.

A generation is submitted to the rollout's worker group and runs there while the driver
goes on; a worker group runs its calls in the order they were made, so a generation
submitted after a weight sync uses the synced weights. `RolloutSource` therefore knows,
without asking the workers, which actor version (updates applied) generated each batch:
the version of the last sync submitted before it. With ``K = off_policy_steps``:

- ``K = 0``: step k's prompts are drawn and generated when step k starts, after the sync
  of version k-1: every sample is on-policy (staleness 0).
- ``K >= 1``: when step k has taken its generation, the generations of steps k+1..k+K are
  submitted (those not yet in flight) and run while step k trains. The sync of version k
  queues behind them, so step k+K is generated with version k-1 and trained by version
  k+K-1: staleness at most K (exactly K in steady state).

Checkpoints store what is in flight (`state_dict`: each pending step's prompt indices, its
generated samples and their version; `routing_state`: their routed experts, for
``actor.router_replay=rollout``, as tensors beside the JSON) instead of regenerating them:
regenerating would need the older weights that produced them. A resumed run takes those samples as they were, and
since the sampler state and the rollout's weights (the checkpoint's version, synced at
resume) are those of the uninterrupted run at that point, it continues exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_mp.config.rollout import SamplingConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.models.routing import check_routed_experts
from verl_mp.rollout.types import RolloutOutput


@dataclass
class Generation:
    """One generate call's prompts, samples and the actor version of the weights used."""

    prompts: PromptBatch
    out: RolloutOutput
    version: int


@dataclass
class _Pending:
    prompts: PromptBatch
    version: int
    call: Any = None
    """The submitted call (`verl_mp.workers.groups.PendingCall`), until it is resolved."""
    out: RolloutOutput | None = None


@dataclass
class RolloutSource:
    workers: Any
    """`verl_mp.workers.groups.WorkerGroups`."""
    dataset: Any
    """The training `PromptDataset` (``get_batch(indices)``)."""
    sampler: Any
    """The `ResumableBatchSampler`; drawn from when a generation is submitted."""
    sampling: Callable[[int, int], SamplingConfig]
    """``(step, round) -> SamplingConfig`` (seeded per step and round)."""
    ahead: int = 0
    """``trainer.off_policy_steps``."""
    record_routing: bool = False
    """Generations record each token's routed experts (``actor.router_replay=rollout``)."""
    version: int = 0
    """The actor version the rollout holds once every sync submitted so far has run."""
    pending: dict[int, _Pending] = field(default_factory=dict)
    routing_model: dict[str, int] | None = None
    """``num_layers``, ``num_experts``, ``top_k`` of the actor (`RankWorker.describe`): what
    routed experts from the rollout engine or a checkpoint must match (None: not checked
    against the model, only for sound values)."""

    def take(self, step: int) -> Generation:
        """Step ``step``'s first-round generation (submitted now if it is not in flight)."""
        if step not in self.pending:
            self._submit(step)
        p = self.pending.pop(step)
        return Generation(p.prompts, self._resolve(p), p.version)

    def generate_now(self, step: int, round_no: int) -> Generation:
        """Another round for ``step`` (dynamic sampling): new prompts, generated at once with
        the weights the rollout holds now."""
        prompts = self.dataset.get_batch(self.sampler.next_batch())
        out = self.workers.generate(prompts.input_ids, self.sampling(step, round_no), self.record_routing)
        self._check_routing(out, f"the routed experts the rollout engine returned for step {step}")
        return Generation(prompts, out, self.version)

    def prefetch(self, step: int, last_step: int) -> None:
        """Submit the generations of steps step+1..step+K (up to ``last_step``) not yet in flight."""
        for j in range(step + 1, min(step + self.ahead, last_step) + 1):
            if j not in self.pending:
                self._submit(j)

    def synced(self, version: int) -> None:
        """A sync to ``version`` was submitted: later generations use it."""
        self.version = version

    def _submit(self, step: int) -> None:
        prompts = self.dataset.get_batch(self.sampler.next_batch())
        call = self.workers.submit_generate(prompts.input_ids, self.sampling(step, 0), self.record_routing)
        self.pending[step] = _Pending(prompts, self.version, call)

    def _resolve(self, p: _Pending) -> RolloutOutput:
        if p.out is None:
            p.out, p.call = self.workers.wait(p.call), None
            self._check_routing(p.out, "the routed experts the rollout engine returned")
        return p.out

    def _check_routing(self, out: RolloutOutput, where: str) -> None:
        """Each sample's routing is ``[len(prompt) + len(response), L, k]`` of sound expert ids."""
        if out.routed_experts is None:
            return
        if len(out.routed_experts) != len(out.response_ids):
            raise ValueError(f"{where}: {len(out.routed_experts)} routing tables for {len(out.response_ids)} samples")
        model = self.routing_model or {}
        for i, routing in enumerate(out.routed_experts):
            length = len(out.prompt_ids[i // out.n]) + len(out.response_ids[i])
            if routing.dim() != 3 or routing.shape[0] != length:
                raise ValueError(f"{where}: sample {i}'s routing has shape {list(routing.shape)}, expected "
                                 f"[{length} (prompt + response tokens), layers, top_k]")
            check_routed_experts(routing, num_experts=model.get("num_experts"), top_k=model.get("top_k"),
                                 num_layers=model.get("num_layers"), where=f"{where} (sample {i})")

    def finished_outputs(self) -> list[RolloutOutput]:
        """The in-flight generations that have finished (resolving them; waits for all)."""
        return [self._resolve(p) for p in self.pending.values()]

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The version and every in-flight generation (waited for), JSON-ready; whether each
        carries routing (its tensors: `routing_state`)."""
        pending = []
        for step, p in sorted(self.pending.items()):
            out = self._resolve(p)
            pending.append({"step": step, "indices": list(p.prompts.indices), "version": p.version,
                            "out": _output_state(out), "routing": out.routed_experts is not None})
        return {"version": self.version, "pending": pending}

    def routing_state(self) -> dict[str, torch.Tensor]:
        """The in-flight generations' routed experts as flat tensors (for safetensors):
        ``step<N>.routing [sum of lengths, L, k]`` and ``step<N>.lengths [samples]``."""
        tensors = {}
        for step, p in sorted(self.pending.items()):
            routing = self._resolve(p).routed_experts
            if routing is not None:
                tensors[f"step{step}.routing"] = torch.cat(routing).contiguous()
                tensors[f"step{step}.lengths"] = torch.tensor([len(r) for r in routing], dtype=torch.int64)
        return tensors

    def load_state_dict(self, state: dict, routing: dict[str, torch.Tensor] | None = None) -> None:
        """Restore `state_dict`'s content; ``routing``: `routing_state`'s tensors, needed when
        a saved generation carries routing."""
        self.version = int(state["version"])
        self.pending = {}
        for e in state["pending"]:
            step, experts = int(e["step"]), None
            if self.record_routing and not e.get("routing"):
                raise ValueError(f"actor.router_replay=rollout, but the checkpoint's generation in flight for step "
                                 f"{step} was made without recording routed experts (a run with another "
                                 "actor.router_replay); resume with that setting, or from a checkpoint without "
                                 "generations in flight (trainer.off_policy_steps=0)")
            if e.get("routing"):
                if routing is None or f"step{step}.routing" not in routing or f"step{step}.lengths" not in routing:
                    raise ValueError(f"the checkpoint's generation in flight for step {step} recorded routed experts, "
                                     "but their tensors are missing (rollout_routing.safetensors beside "
                                     "trainer_state.json); resume from another checkpoint")
                experts = _split_routing(routing[f"step{step}.routing"], routing[f"step{step}.lengths"], step)
            out = RolloutOutput(**e["out"], routed_experts=experts)
            self._check_routing(out, f"rollout_routing.safetensors of the checkpoint (step {step})")
            self.pending[step] = _Pending(self.dataset.get_batch(e["indices"]), int(e["version"]), out=out)


def _split_routing(table: torch.Tensor, lengths: torch.Tensor, step: int) -> list[torch.Tensor]:
    """``step<N>.routing [sum of lengths, L, k]`` back into one table per sample."""
    where = f"rollout_routing.safetensors of the checkpoint (step {step})"
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or bool((lengths < 0).any()):
        raise ValueError(f"{where}: step{step}.lengths must be a list of sample lengths, got "
                         f"{lengths.dtype} {list(lengths.shape)}")
    if table.dim() != 3 or table.shape[0] != int(lengths.sum()):
        raise ValueError(f"{where}: step{step}.routing has shape {list(table.shape)}, expected "
                         f"[{int(lengths.sum())} (the sum of its lengths), layers, top_k]")
    return list(torch.split(table, lengths.tolist()))


def _output_state(out: RolloutOutput) -> dict:
    return {"prompt_ids": out.prompt_ids, "response_ids": out.response_ids,
            "response_logprobs": out.response_logprobs, "n": out.n, "finished": out.finished,
            "metrics": out.metrics, "wall_start": out.wall_start, "wall_end": out.wall_end,
            "response_masks": out.response_masks, "trajectories": out.trajectories}
