"""Multi-turn generation on the colocated vLLM engine (`verl_mp.rollout.multi_turn`).

vLLM's offline ``LLM.generate`` runs one batch to the end; a multi-turn rollout instead drives
the engine step by step (``LLM.llm_engine``: ``add_request``, ``has_unfinished_requests``,
``step``, in vLLM 0.26 as in 0.32), adding each conversation's next turn, as a
``TokensPrompt`` of its exact ids, as soon as its tool results are back.

Log-probs come from the sampler (``rollout.logprobs_source=sampler``, the default;
`verl_mp.patches.vllm_sampled_logprobs`) as for single-turn generation: one capture is open
over all the conversations' steps, each turn's log-probs are cut from it once the last
conversation is done and written over the turn's place in its conversation
(`Conversation.turn_spans`). With ``logprobs_source=vllm`` each finished turn carries vLLM's
own per-token objects.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl_mp.config.rollout import RolloutConfig, SamplingConfig
from verl_mp.data.chat_fragments import ToolResponseFormat
from verl_mp.patches import vllm_sampled_logprobs
from verl_mp.reward.tool_parser import get_tool_parser
from verl_mp.reward.tool_pool import ToolPool
from verl_mp.reward.tools import resolve_tools
from verl_mp.reward.worker_proc import WorkerLimits
from verl_mp.rollout.multi_turn import (
    Conversation,
    MultiTurnState,
    TurnLink,
    TurnOutput,
    TurnRequest,
    merge_metrics,
    run_turns,
)
from verl_mp.rollout.routing_capture import routing_for, routing_from_vllm
from verl_mp.rollout.types import CarriedGroup, CarryRequest, RolloutOutput


@dataclass
class GroupResult:
    """One prompt group's conversations after a generation, on its engine's leader."""

    rows: list[tuple]
    """Each done conversation's ``(ids, log-probs, finished, routing, mask, trajectory)``."""
    states: list[dict] | None
    """Carry-over: every conversation's `Conversation.state` (None without carry-over)."""
    complete: bool
    """Every conversation of the group is done."""


class VLLMTurnEngine:
    """`verl_mp.rollout.multi_turn.TurnEngine` over vLLM's ``LLMEngine``."""

    def __init__(self, llm, sampling: SamplingConfig, params_fn, routing: bool,
                 capture: vllm_sampled_logprobs.Capture | None = None, one_engine: bool = True):
        self.engine, self.sampling, self.params_fn, self.routing = llm.llm_engine, sampling, params_fn, routing
        self.one_engine = one_engine
        """No data-parallel engines beside this one (`abort_all` may step it alone)."""
        self.capture = capture
        """Open over every step when the sampler records the log-probs (then turns carry none)."""
        self.finished: list = []
        """Every finished request's output, for `sampled_logprobs` (with a capture only)."""
        self.running: set[str] = set()
        """Request ids added and not finished (what `abort_all` drops)."""

    def add(self, request: TurnRequest) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = self.params_fn(request)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate: one output per request, at its end
        self.engine.add_request(request.request_id, TokensPrompt(prompt_token_ids=request.prompt_ids), params)
        self.running.add(request.request_id)

    def has_unfinished(self) -> bool:
        """Any engine's (with DP engines vLLM all-reduces it, and an idle engine's next step runs
        a dummy batch): call it once per round on every rank."""
        return self.engine.has_unfinished_requests()

    def running_here(self) -> bool:
        return self.engine.get_num_unfinished_requests() > 0

    def step(self) -> list[TurnOutput]:
        outputs = []
        for out in self.engine.step():
            if not out.finished:
                continue
            self.running.discard(out.request_id)
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = None
            if self.capture is not None:
                self.finished.append(out)
            elif self.sampling.logprobs:
                lps = [entry[tok].logprob for tok, entry in zip(ids, comp.logprobs, strict=True)]
            outputs.append(TurnOutput(out.request_id, ids, lps, comp.finish_reason == "stop",
                                      getattr(comp, "routed_experts", None) if self.routing else None,
                                      prompt_tokens=len(out.prompt_token_ids or ()),
                                      cached_tokens=out.num_cached_tokens or 0))
        return outputs

    def abort_all(self) -> int:
        """Every rank of the engine added the same requests and saw the same ones finish, so
        each drops the same set (vLLM frees their KV cache blocks)."""
        aborted = sorted(self.running)
        if aborted:
            self.engine.abort_request(aborted)
            if self.one_engine:
                # with asynchronous scheduling vLLM keeps up to two scheduled batches in flight: let them land now
                # (their outputs belong to aborted requests and are dropped), before the engine sleeps or its weights
                # change. Not with data-parallel engines: their steps pair up in collectives (vLLM's own DP sync),
                # which unmatched steps would hang.
                for _ in range(2):
                    self.engine.step()
        self.running.clear()
        return len(aborted)

    def sampled_logprobs(self) -> dict[str, list[float]]:
        """Each finished turn's log-probs from the capture (one host copy), by request id."""
        per_output = self.capture.logprobs(self.finished)
        return {out.request_id: lps[0] for out, lps in zip(self.finished, per_output, strict=True)}


class MultiTurnRollout:
    """What a vLLM rollout needs for multi-turn generation, built with it: the tokenizer's
    tool-response fragments, the tools and parser, the lockstep groups and (on each
    engine's leader) the tool pool."""

    def __init__(self, cfg: RolloutConfig, model_path: str, rank: int, tp_size: int, dp_size: int):
        from transformers import AutoTokenizer

        mt = cfg.multi_turn
        self.cfg, self.rank, self.tp_size = cfg, rank, tp_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.fmt = ToolResponseFormat(self.tokenizer, mt.tool_role)
        self.tools = resolve_tools(mt.tools)
        self.parser = get_tool_parser(mt.tool_parser)
        self.leader = rank % tp_size == 0
        self.link = _make_link(rank, tp_size, dp_size)
        self.pool = None
        if self.leader:
            self.pool = ToolPool(mt.tool_num_workers, mt.tool_timeout_s,
                                 WorkerLimits(memory_mb=mt.tool_memory_limit_mb, cpu_s=mt.tool_cpu_limit_s))
            self.pool.start()

    def generate(self, rollout, prompt_ids: list[list[int]], mine: list[int], sampling: SamplingConfig,
                 routing: str | None, carry: CarryRequest | None = None
                 ) -> tuple[dict[int, GroupResult], dict[str, float]]:
        """This engine's conversations (``sampling.n`` for each group index in ``mine``: the
        carried groups first, then ``prompt_ids``) run to their end, or with ``carry`` until
        ``carry.take`` groups of all engines are done; `GroupResult` per group on the leader
        ({} elsewhere) and its raw counters. ``routing``: ``hooks``, ``vllm`` or None."""
        carried = carry.groups if carry is not None else []
        convs = []
        for g in mine:
            if g < len(carried):
                if len(carried[g].conversations) != sampling.n:
                    raise ValueError(f"a carried prompt group has {len(carried[g].conversations)} conversations, but "
                                     f"rollout.sampling.n={sampling.n}: resume with the n that cut it")
                convs += [Conversation.from_state(g * sampling.n + j, carried[g].prompt_ids, st)
                          for j, st in enumerate(carried[g].conversations)]
            else:
                convs += [Conversation(g * sampling.n + j, list(prompt_ids[g - len(carried)]))
                          for j in range(sampling.n)]
        required = {g for g in mine if g < len(carried) and carried[g].must_finish}
        state = MultiTurnState(self.cfg.multi_turn, sampling, self.tokenizer, self.fmt, self.tools, self.parser,
                               self.pool, convs, required,
                               tool_steps=self.cfg.multi_turn.carry_tool_steps if carry is not None else 0) \
            if self.leader else None
        from_sampler = sampling.logprobs and rollout.sampler_logprobs
        with vllm_sampled_logprobs.capture() if from_sampler else contextlib.nullcontext() as sampled:
            engine = VLLMTurnEngine(rollout.llm, sampling, lambda r: rollout.turn_params(sampling, r),
                                    routing == "vllm", sampled, one_engine=rollout.dp_size == 1)
            timings = run_turns(engine, self.link, state, self.cfg.multi_turn.admit_interval,
                                take=carry.take if carry is not None else None)
            if state is None:
                return {}, {}
            if from_sampler:
                by_request = engine.sampled_logprobs()
                for conv in convs:
                    for request_id, start in conv.turn_spans:
                        lps = by_request[request_id]
                        conv.logprobs[start: start + len(lps)] = lps
        captured = rollout.finish_routing() if routing == "hooks" else None
        local = {g: GroupResult([], [] if carry is not None else None, True) for g in mine}
        for conv in convs:
            group = local[conv.index // sampling.n]
            group.complete = group.complete and conv.done
            if conv.done:
                experts = _conversation_routing(conv, routing, captured)
                lps = conv.logprobs if sampling.logprobs else None
                group.rows.append((conv.ids, lps, conv.finished, experts, conv.mask, conv.trajectory()))
            if group.states is not None:
                group.states.append(conv.state())
        return local, {**state.metrics(), **timings}

    def output(self, prompt_ids: list[list[int]], merged: dict[int, GroupResult], sampling: SamplingConfig,
               parts: list[dict[str, float]], record_routing: bool, carry: CarryRequest | None = None) -> RolloutOutput:
        """Every group's samples (prompt order); with ``carry``: the first ``carry.take``
        complete groups (carried ones first: the oldest), and the others as `CarriedGroup`."""
        prompts = [g.prompt_ids for g in carry.groups] if carry is not None else []
        prompts += [list(p) for p in prompt_ids]
        complete = [g for g in range(len(prompts)) if merged[g].complete]
        if carry is not None:  # the groups that must finish are taken first (then the oldest)
            complete.sort(key=lambda g: not (g < len(carry.groups) and carry.groups[g].must_finish))
        taken = complete if carry is None else complete[: carry.take]
        rows = [s for g in taken for s in merged[g].rows]
        out = RolloutOutput(prompt_ids=[prompts[g] for g in taken], response_ids=[r[0] for r in rows],
                            response_logprobs=[r[1] for r in rows] if sampling.logprobs else None, n=sampling.n,
                            finished=[r[2] for r in rows], routed_experts=[r[3] for r in rows] if record_routing else None,
                            response_masks=[r[4] for r in rows], trajectories=[r[5] for r in rows],
                            metrics=merge_metrics([p for p in parts if p]))
        if carry is not None:
            chosen = set(taken)
            out.groups = taken
            out.carried = [CarriedGroup(prompt_ids=prompts[g], conversations=merged[g].states, position=g)
                           for g in range(len(prompts)) if g not in chosen]
            out.metrics["rollout/multi_turn/carried_in_groups"] = float(len(carry.groups))
            out.metrics["rollout/multi_turn/carried_out_groups"] = float(len(out.carried))
            out.metrics.update(batch_turn_metrics([r[5] for r in rows]))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def batch_turn_metrics(trajectories: list[dict]) -> dict[str, float]:
    """Turns and tool calls per conversation of the conversations a generation returns, from
    their whole trajectories. With carry-over the counters (`merge_metrics`) count one
    generation's turns over all the conversations it ran, cut ones included, while a returned
    conversation may have begun in an earlier generation; these count what the batch holds.
    Without carry-over both give the same numbers: every call gets one tool message, also when
    its turn ended the conversation, and a cut answers the calls already made."""
    if not trajectories:
        return {}
    convs = len(trajectories)
    return {"rollout/multi_turn/turns_per_conversation": sum(t["num_turns"] for t in trajectories) / convs,
            "rollout/multi_turn/tool_calls_per_conversation":
                sum(sum(m["role"] == "tool" for m in t["messages"]) for t in trajectories) / convs}


def _conversation_routing(conv: Conversation, routing: str | None, captured) -> torch.Tensor | None:
    """``[P + R, L, k]`` routed experts of the whole conversation: its last request ran every
    position before the last token (the prompt, earlier turns and tool responses included)."""
    if routing == "hooks":
        return routing_for(captured, conv.prompt, conv.ids)
    if routing == "vllm":
        last = len(conv.prompt) + len(conv.ids) - conv.last_prompt_len
        return routing_from_vllm(conv.routing, conv.last_prompt_len, last)
    return None


def _make_link(rank: int, tp_size: int, dp_size: int) -> TurnLink:
    """Gloo groups (also beside NCCL: the messages are Python objects) of every TP group and of
    all ranks; every rank creates every group, in the same order."""
    if not dist.is_initialized() or tp_size * dp_size == 1:
        return TurnLink()
    tp_group = None
    if tp_size > 1:
        for d in range(dp_size):
            group = dist.new_group(list(range(d * tp_size, (d + 1) * tp_size)), backend="gloo")
            if rank // tp_size == d:
                tp_group = group
    dp_group = dist.new_group(backend="gloo") if dp_size > 1 else None
    return TurnLink(tp_group, leader=(rank // tp_size) * tp_size, dp_group=dp_group)


def gather_leaders(local: dict, metrics: dict[str, float], leader: bool) -> tuple[dict, list[dict[str, float]]]:
    """Every engine leader's conversations and counters, on every rank (the other ranks of an
    engine ran its steps but own no conversation)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local, [metrics]
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (local, metrics) if leader else ({}, {}))
    merged: dict = {}
    for part, _ in parts:
        merged.update(part)
    return merged, [m for _, m in parts if m]
