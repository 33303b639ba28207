"""What a rollout backend returns, and the interface every backend implements."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from verl_mp.config.rollout import SamplingConfig


@dataclass(kw_only=True)
class CarriedGroup:
    """One prompt's ``n`` conversations cut at a turn boundary by a multi-turn generation
    with carry-over (``rollout.multi_turn.carry_over``), to go on in a later generation.
    JSON-ready (``dataclasses.asdict``); `verl_mp.rollout.multi_turn.Conversation.state` is each entry."""

    prompt_ids: list[int]
    conversations: list[dict]
    must_finish: bool = False
    """The generation that takes it ends only once it is done (it is not cut again)."""
    position: int = -1
    """Where it stood in the generation that cut it (carried groups first, then new prompts)."""


@dataclass(kw_only=True)
class CarryRequest:
    """What a multi-turn generation with carry-over gets besides its new prompts."""

    groups: list[CarriedGroup]
    """Groups cut by earlier generations; they go first, before the new prompts."""
    take: int
    """Prompt groups to complete: the generation ends once this many are done (and every
    ``must_finish`` group), cutting the others."""


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
    routed_experts: list[torch.Tensor] | None = None
    """Mixture-of-experts rollouts that recorded their routing: per sample ``[len(prompt) +
    len(response), L, k]`` int16, the experts each position was routed to in each MoE layer
    (-1 at the last position, which the rollout never ran)."""
    response_masks: list[list[int]] | None = None
    """Multi-turn rollouts: per response token 1 if the model generated it, 0 if it belongs to a
    tool response (the loss skips it; its log-prob entry is 0). None: every token is the model's."""
    trajectories: list[dict] | None = None
    """Multi-turn rollouts: per sample the conversation (`verl_mp.rollout.multi_turn`:
    ``messages``: assistant turns with their tool calls, tool responses with their status;
    ``num_turns``, ``num_tool_calls``, ``finished``, ``stop_reason``). JSON-ready."""
    groups: list[int] | None = None
    """A generation with carry-over (`CarryRequest`): for each of its prompts, where that
    prompt stood among the generation's groups (carried first, then the new prompts)."""
    carried: list[CarriedGroup] | None = None
    """A generation with carry-over: the groups it cut, to go on in the next one."""

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.prompt_ids) * self.n:
            raise ValueError("RolloutOutput: need n responses per prompt")
        for ids, lps in zip(self.response_ids, self.response_logprobs or self.response_ids, strict=True):
            if len(ids) != len(lps):
                raise ValueError("RolloutOutput: one log-prob per response token required")
        for ids, mask in zip(self.response_ids, self.response_masks or self.response_ids, strict=True):
            if len(ids) != len(mask):
                raise ValueError("RolloutOutput: one mask entry per response token required")
        if self.trajectories is not None and len(self.trajectories) != len(self.response_ids):
            raise ValueError("RolloutOutput: one trajectory per response required")

    def select(self, prompts: list[int]) -> RolloutOutput:
        """The samples of ``prompts`` (indices), in that order; every per-sample field follows
        (metrics and wall times are kept)."""
        rows = [g * self.n + j for g in prompts for j in range(self.n)]

        def pick(values):
            return None if values is None else [values[r] for r in rows]

        return RolloutOutput(prompt_ids=[self.prompt_ids[g] for g in prompts], response_ids=pick(self.response_ids),
                             response_logprobs=pick(self.response_logprobs), n=self.n, finished=pick(self.finished),
                             metrics=dict(self.metrics), wall_start=self.wall_start, wall_end=self.wall_end,
                             routed_experts=pick(self.routed_experts), response_masks=pick(self.response_masks),
                             trajectories=pick(self.trajectories))

    @staticmethod
    def concat(parts: list[RolloutOutput]) -> RolloutOutput:
        """The samples of ``parts`` one after the other (metrics and wall times of the first)."""
        first = parts[0]

        def join(name):
            if getattr(first, name) is None:
                return None
            return [x for p in parts for x in getattr(p, name)]

        return RolloutOutput(prompt_ids=join("prompt_ids"), response_ids=join("response_ids"),
                             response_logprobs=join("response_logprobs"), n=first.n, finished=join("finished"),
                             metrics=dict(first.metrics), wall_start=first.wall_start, wall_end=first.wall_end,
                             routed_experts=join("routed_experts"), response_masks=join("response_masks"),
                             trajectories=join("trajectories"))

    @property
    def num_tokens(self) -> int:
        return sum(len(r) for r in self.response_ids)

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the engine sampled: all response tokens, less the tool responses' of
        multi-turn samples (what generation speed counts)."""
        if self.response_masks is None:
            return self.num_tokens
        return sum(sum(m) for m in self.response_masks)

    def final_texts(self) -> list[str] | None:
        """Multi-turn: each sample's last assistant turn (what a reward function reads as its
        answer); None for single-turn samples (the response is the answer)."""
        if self.trajectories is None:
            return None
        return [next((m["content"] for m in reversed(t["messages"]) if m["role"] == "assistant"), "")
                for t in self.trajectories]

    def padded_masks(self, max_len: int) -> torch.Tensor | None:
        """``response_masks`` as ``[B, max_len]`` float32, right-padded with 0 (None if absent)."""
        if self.response_masks is None:
            return None
        out = torch.zeros(len(self.response_masks), max_len, dtype=torch.float32)
        for i, mask in enumerate(self.response_masks):
            out[i, : len(mask)] = torch.tensor(mask[:max_len], dtype=torch.float32)
        return out

    def padded_logprobs(self, max_len: int | None = None) -> torch.Tensor | None:
        """Response log-probs as ``[B, T]`` float32, right-padded with 0 (None if not returned)."""
        if self.response_logprobs is None:
            return None
        max_len = max_len or max((len(r) for r in self.response_ids), default=0)
        out = torch.zeros(len(self.response_ids), max_len, dtype=torch.float32)
        for i, lps in enumerate(self.response_logprobs):
            out[i, : len(lps)] = torch.tensor(lps[:max_len], dtype=torch.float32)
        return out


@dataclass(frozen=True)
class ExpertLayout:
    """How vLLM holds a mixture-of-experts model's routed experts on this rank.

    Per MoE layer two fused parameters: ``w13`` ``[E_loc, 2 * I_loc, H]`` (each expert's gate
    rows, then its up rows) and ``w2`` ``[E_loc, H, I_loc]``; slot ``k`` holds global expert
    ``experts[k]``, sliced for expert-TP rank ``tp_rank`` of ``tp_size`` (``I_loc = I / tp_size``).
    Without vLLM expert parallelism every rank holds all experts and ``tp_size`` is the rollout
    TP x DP; with it, ``tp_size`` is 1 and each rank holds a block of experts.
    """

    tp_size: int
    tp_rank: int
    experts: tuple[int, ...]
    """Global expert index of each local slot."""
    w13: dict[int, str]
    """Layer index -> name of its ``w13`` parameter (e.g.
    ``model.layers.0.mlp.experts.routed_experts.w13_weight`` in vLLM 0.32)."""
    w2: dict[int, str]


def expert_slot(param_name: str, slot: int) -> str:
    """The name under which a weight stream addresses one expert of a fused parameter
    (``...w13_weight[3]``); `VLLMRollout.load_weights` copies it into that slot."""
    return f"{param_name}[{slot}]"


def split_expert_slot(name: str) -> tuple[str, int | None]:
    """Inverse of `expert_slot`: ``(parameter name, slot)``, slot None for a whole parameter."""
    if name.endswith("]") and "[" in name:
        base, slot = name[:-1].rsplit("[", 1)
        return base, int(slot)
    return name, None


class RolloutBackend(Protocol):
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 record_routing: bool = False, carry: CarryRequest | None = None) -> RolloutOutput:
        """``record_routing``: also each sequence's routed experts (a backend that cannot
        record them raises). ``carry``: a multi-turn generation with carry-over (vLLM only)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights from HF-named full tensors, consumed lazily in order."""

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def close(self) -> None:
        """Release what would outlive the process otherwise (e.g. shared memory)."""


def chain_weights(buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> Iterator[tuple[str, torch.Tensor]]:
    for bucket in buckets:
        yield from bucket
