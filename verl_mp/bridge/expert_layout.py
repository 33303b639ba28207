"""Routed experts in the weight sync (pure functions): stream order and vLLM expert slots.

Megatron's expert-parallel rank ``r`` of ``EP`` holds global experts ``[r * E / EP, (r + 1) * E / EP)``
of every MoE layer on its pipeline stage, each split over the expert-TP group (linear_fc1
``[gate_t; up_t]``, linear_fc2 the column slice ``t``). vLLM keeps a layer's experts in two
fused parameters (`verl_mp.rollout.types.ExpertLayout`).

``gather`` mode: every rank needs every expert (vLLM without expert parallelism holds all of
them, TP-sliced; its loader takes its slice of per-expert HF tensors). `merge_expert_runs`
builds one stream order in which each layer's experts, those of every EP rank in rank order,
stand where that layer's experts stand on one rank; buckets then hold the experts of one EP
rank, which broadcasts them inside its EP group. The order stays layer by layer because
vLLM's in-place reload buffers a layer's tensors until the whole layer has arrived (it
re-processes the fused expert tensors from raw ones), so it holds one layer at a time.

``local`` mode: when vLLM's rank holds the same experts at the same expert-TP slice as
megatron's (`local_mismatch` is None), each local expert moves in place: linear_fc1 ->
``w13[slot]``, linear_fc2 -> ``w2[slot]`` (`local_expert_tensors`), no communication.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

import torch

from verl_mp.rollout.types import ExpertLayout, expert_slot

T = TypeVar("T")
_EXPERT = re.compile(r"^decoder\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


def expert_of(megatron_name: str) -> tuple[int, int, str] | None:
    """``(layer, global expert, "linear_fc1" | "linear_fc2")`` of a routed expert's global
    megatron name; None for anything else (the shared expert and the router included)."""
    m = _EXPERT.match(megatron_name)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def merge_expert_runs(per_rank: list[list[T]], name_of: Callable[[T], str]) -> list[T]:
    """EP ranks' parameter lists (same stage, same order; dense items identical) -> one list:
    the dense items in order and, where a layer's experts first appear, the experts of that
    layer of every rank, rank by rank."""
    by_layer: list[dict[int, list[T]]] = []
    for items in per_rank:
        layers: dict[int, list[T]] = {}
        for item in items:
            hit = expert_of(name_of(item))
            if hit is not None:
                layers.setdefault(hit[0], []).append(item)
        by_layer.append(layers)
    out, done = [], set()
    for item in per_rank[0]:
        hit = expert_of(name_of(item))
        if hit is None:
            out.append(item)
        elif hit[0] not in done:
            done.add(hit[0])
            for layers in by_layer:
                out += layers[hit[0]]
    return out


def megatron_experts(num_experts: int, ep_rank: int, ep_size: int) -> tuple[int, ...]:
    """Global experts of megatron's expert-parallel rank ``ep_rank``."""
    per_rank = num_experts // ep_size
    return tuple(range(ep_rank * per_rank, (ep_rank + 1) * per_rank))


def local_mismatch(layout: ExpertLayout | None, experts: tuple[int, ...], etp_rank: int,
                   etp_size: int) -> str | None:
    """Why this rank's experts cannot move in place into vLLM's (None: they can)."""
    if layout is None:
        return "vLLM reports no fused-MoE layers for this mixture-of-experts model"
    if (layout.tp_size, layout.tp_rank) != (etp_size, etp_rank):
        return (f"vLLM splits each expert over {layout.tp_size} ranks (this one is {layout.tp_rank}), megatron over "
                f"expert-TP {etp_size} (rank {etp_rank}): use expert_tensor_parallel_size equal to vLLM's "
                "expert split (1 with rollout.expert_parallel=true, else the rollout TP)")
    if set(layout.experts) != set(experts):
        return (f"vLLM holds experts {_span(layout.experts)} on this rank, megatron {_span(experts)}: with "
                "rollout.expert_parallel=true, expert_model_parallel_size must equal rollout TP x DP")
    return None


def _span(experts: tuple[int, ...]) -> str:
    return f"{experts[0]}..{experts[-1]}" if experts else "none"


def local_expert_tensors(megatron_name: str, shard: torch.Tensor,
                         layout: ExpertLayout) -> list[tuple[str, torch.Tensor]]:
    """One local expert's shard -> ``[(expert slot name, tensor)]`` (see the module doc)."""
    layer, expert, which = expert_of(megatron_name)
    param = layout.w13[layer] if which == "linear_fc1" else layout.w2[layer]
    return [(expert_slot(param, layout.experts.index(expert)), shard)]
