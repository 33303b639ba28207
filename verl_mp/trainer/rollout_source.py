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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from verl_mp.config.rollout import SamplingConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.models.routing import check_routed_experts
from verl_mp.rollout.types import CarriedGroup, CarryRequest, RolloutOutput


@dataclass
class Generation:
    """One generate call's prompts, samples and the actor version of the weights used."""

    prompts: PromptBatch
    out: RolloutOutput
    version: int
    group_versions: list[int] | None = None
    """Carry-over: per prompt group, the version its first tokens were sampled with (older
    than ``version`` for groups carried from earlier generations)."""

    def sample_versions(self) -> torch.Tensor:
        """``[samples]`` the oldest actor version each sample's tokens come from."""
        if self.group_versions is None:
            return torch.full((len(self.out.response_ids),), self.version, dtype=torch.int64)
        return torch.tensor(self.group_versions, dtype=torch.int64).repeat_interleave(self.out.n)


@dataclass
class _Carried:
    """A prompt group cut by a generation (`CarriedGroup`), with what the driver knows of it."""

    index: int
    """Its prompt's position in the training dataset."""
    version: int
    """The actor version its first tokens were sampled with."""
    cuts: int
    """Generations that cut it so far."""
    group: CarriedGroup


@dataclass
class _Pending:
    prompts: PromptBatch
    version: int
    call: Any = None
    """The submitted call (`verl_mp.workers.groups.PendingCall`), until it is resolved."""
    out: RolloutOutput | None = None
    sources: list[tuple[int, int, int]] | None = None
    """Carry-over, until resolved: each group of the call (carried first, then the new
    prompts) as (dataset index, version of its first tokens, cuts so far)."""
    group_versions: list[int] | None = None


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
    carry_take: int = 0
    """``rollout.multi_turn.carry_over``: prompt groups each generation completes
    (``data.train_batch_size``); 0: off, every generation runs its prompts to the end."""
    carry_pool: int = 0
    """Carry-over: prompt groups in each generation (the carried ones, then new prompts)."""
    carry_max_cuts: int = 1
    """Carry-over: a group cut this many times must finish in its next generation."""
    carried: list[_Carried] = field(default_factory=list)
    """Carry-over: the groups the last resolved generation cut, for the next submitted one."""
    backlog: list[int] = field(default_factory=list)
    """Carry-over: dataset indices drawn from the sampler (whole batches) and not yet started."""

    def take(self, step: int) -> Generation:
        """Step ``step``'s first-round generation (submitted now if it is not in flight)."""
        if step not in self.pending:
            self._submit(step)
        p = self.pending.pop(step)
        out = self._resolve(p)
        return Generation(p.prompts, out, p.version, p.group_versions)

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
        if not self.carry_take:
            prompts = self.dataset.get_batch(self.sampler.next_batch())
            call = self.workers.submit_generate(prompts.input_ids, self.sampling(step, 0), self.record_routing)
            self.pending[step] = _Pending(prompts, self.version, call)
            return
        need = self.carry_pool - len(self.carried)
        while len(self.backlog) < need:
            self.backlog += list(self.sampler.next_batch())
        new, self.backlog = self.backlog[:need], self.backlog[need:]
        prompts = self.dataset.get_batch(new)
        carried, self.carried = self.carried, []
        request = CarryRequest(groups=[replace(c.group, must_finish=c.cuts >= self.carry_max_cuts) for c in carried],
                               take=self.carry_take)
        call = self.workers.submit_generate(prompts.input_ids, self.sampling(step, 0), self.record_routing, request)
        sources = [(c.index, c.version, c.cuts) for c in carried] + [(i, self.version, 0) for i in new]
        self.pending[step] = _Pending(prompts, self.version, call, sources=sources)

    def _resolve(self, p: _Pending) -> RolloutOutput:
        if p.out is None:
            p.out, p.call = self.workers.wait(p.call), None
            self._check_routing(p.out, "the routed experts the rollout engine returned")
            if p.sources is not None:
                self._split_carry(p)
        return p.out

    def _split_carry(self, p: _Pending) -> None:
        """A carry-over generation came back: its prompts become the groups it completed, and
        the groups it cut wait for the next generation."""
        out, sources = p.out, p.sources
        if out.groups is None or out.carried is None or len(out.groups) != self.carry_take:
            raise RuntimeError(f"a carry-over generation returned {len(out.groups or ())} complete prompt groups, "
                               f"expected rollout.multi_turn's take of {self.carry_take}")
        p.prompts = self.dataset.get_batch([sources[g][0] for g in out.groups])
        p.group_versions = [sources[g][1] for g in out.groups]
        self.carried = [_Carried(sources[c.position][0], sources[c.position][1], sources[c.position][2] + 1,
                                 replace(c, must_finish=False)) for c in out.carried]
        p.sources = None

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
                            "group_versions": p.group_versions,
                            "out": _output_state(out), "routing": out.routed_experts is not None})
        state = {"version": self.version, "pending": pending}
        if self.carry_take:
            state["carry"] = {"take": self.carry_take, "groups": [asdict(c) for c in self.carried],
                              "backlog": list(self.backlog)}
        return state

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
        self._load_carry(state.get("carry"))
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
            self.pending[step] = _Pending(self.dataset.get_batch(e["indices"]), int(e["version"]), out=out,
                                          group_versions=e.get("group_versions"))

    def _load_carry(self, carry: dict | None) -> None:
        """The carried groups and the drawn prompts not yet started (carry-over)."""
        self.carried, self.backlog = [], []
        if carry is None:
            return
        if not self.carry_take:
            if carry["groups"] or carry["backlog"]:
                raise ValueError("the checkpoint holds multi-turn conversations carried over to the next step "
                                 "(rollout.multi_turn.carry_over=true when it was saved); resume with carry_over=true")
            return
        if int(carry["take"]) != self.carry_take:
            raise ValueError(f"the checkpoint carries conversations over with data.train_batch_size={carry['take']}, "
                             f"this run has {self.carry_take}: resume with the batch size it was saved with")
        self.backlog = [int(i) for i in carry["backlog"]]
        for e in carry["groups"]:
            group = CarriedGroup(**e["group"])
            if list(group.prompt_ids) != list(self.dataset.get_batch([int(e["index"])]).input_ids[0]):
                raise ValueError(f"the checkpoint's carried conversations of dataset row {e['index']} do not start "
                                 "with that row's prompt: the training data or its chat template changed since")
            self.carried.append(_Carried(int(e["index"]), int(e["version"]), int(e["cuts"]), group))


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
