"""Where each megatron parameter of this rank sits in the global model.

`megatron_param_layout` lists, for every local parameter, its *global* name (global layer
index, canonical local-spec names even under transformer-engine) and how it is split over
tensor-parallel ranks. The weight sync to the rollout engine and the HF export use it as:

    for info in megatron_param_layout(chunks, state):
        shards = all_gather(info.param, group=tp_group)      # list of tp_size tensors
        full = info.merge_tp_shards(shards)                  # TP=1 layout, padded vocab
        for hf_name, tensor in megatron_to_hf(spec, info.global_name, full): ...

TP-gather convention: shards are concatenated along ``tp_dim``, except the fused SwiGLU
``linear_fc1`` (``tp_layout == "gate_up"``): each rank holds ``[gate_r; up_r]``, so the
concatenation ``[gate_0; up_0; gate_1; up_1; ...]`` is reordered to ``[gate; up]`` by
`merge_tp_shards`. Fused QKV needs no reordering: each rank holds whole query groups, and
groups are interleaved the same way on every rank. Vocabulary rows stay padded to a TP
multiple; `megatron_to_hf` drops the padding.

Besides parameters, the layout lists the routers' ``expert_bias`` buffers (DeepSeek-V3's
sigmoid routing bias): part of the model's weights, but not trained by the optimizer.

Mixture-of-experts: a routed expert's parameters (``ParamInfo.expert``) are split over the
*expert*-TP group (`ParallelState.etp_group`), not the TP group; megatron's local expert
``k`` on expert-parallel rank ``r`` gets the global name ``mlp.experts.{r * E_local + k}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from verl_mp.engine.runtime import ParallelState

# transformer-engine fuses the pre-attention/pre-MLP norms into the next linear.
_TE_CANONICAL = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ParamInfo:
    chunk_index: int
    """Virtual-pipeline chunk holding the parameter (0 without VPP)."""
    local_name: str
    """Name inside the unwrapped GPTModel chunk (local layer index)."""
    global_name: str
    """Name with the global layer index; the key of `verl_mp.models.convert`."""
    tp_dim: int | None
    """Dimension split over TP ranks; None when every TP rank holds the whole tensor."""
    tp_layout: str
    """``contiguous`` (concatenate shards along tp_dim) or ``gate_up`` (fused fc1)."""
    param: torch.Tensor
    """The parameter (or, for a router's ``expert_bias``, the buffer)."""
    expert: bool = False
    """A routed expert's parameter: split over expert-TP, held by one expert-parallel rank."""

    def merge_tp_shards(self, shards: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """TP shards (in TP-rank order) -> the full TP=1 tensor (vocabulary still padded),
        written into ``out`` when given (e.g. a slice of a flat sync bucket)."""
        return merge_tp_shards(shards, self.tp_dim, self.tp_layout, out=out)

    def shard(self, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
        """Inverse of `merge_tp_shards`: this TP rank's slice of a full tensor."""
        return split_tp_shard(full, self.tp_dim, self.tp_layout, tp_rank, tp_size)


def merge_tp_shards(shards: list[torch.Tensor], tp_dim: int | None, tp_layout: str,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    if tp_dim is None or len(shards) == 1:
        return shards[0] if out is None else out.copy_(shards[0])
    if tp_layout == "gate_up":
        halves = [s.chunk(2, dim=tp_dim) for s in shards]
        shards = [h[0] for h in halves] + [h[1] for h in halves]
    return torch.cat(shards, dim=tp_dim, out=out) if out is not None else torch.cat(shards, dim=tp_dim)


def split_tp_shard(full: torch.Tensor, tp_dim: int | None, tp_layout: str, tp_rank: int,
                   tp_size: int) -> torch.Tensor:
    if tp_dim is None or tp_size == 1:
        return full
    if tp_layout == "gate_up":
        gate, up = full.chunk(2, dim=tp_dim)
        return torch.cat([gate.chunk(tp_size, tp_dim)[tp_rank], up.chunk(tp_size, tp_dim)[tp_rank]], tp_dim)
    return full.chunk(tp_size, dim=tp_dim)[tp_rank]


def unwrap(chunk):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def global_layer_names(model) -> dict[int, int]:
    """Local layer index -> global (0-based) layer index for one GPTModel chunk."""
    return {i: layer.layer_number - 1 for i, layer in enumerate(model.decoder.layers)}


def canonical_name(local_name: str, layer_map: dict[int, int], expert_offset: int = 0) -> str:
    """Local name -> global name: global layer index, TE norm names mapped back, local expert
    ``k`` -> global expert ``expert_offset + k``."""
    m = _LAYER.match(local_name)
    if not m:
        return local_name
    rest = _TE_CANONICAL.get(m.group(2), m.group(2))
    e = _LOCAL_EXPERT.match(rest)
    if e:
        rest = f"mlp.experts.{expert_offset + int(e.group(1))}.{e.group(2)}"
    return f"decoder.layers.{layer_map[int(m.group(1))]}.{rest}"


def _weights(model) -> list[tuple[str, torch.Tensor]]:
    """Named parameters, then the routers' ``expert_bias`` buffers."""
    buffers = [(n, b) for n, b in model.named_buffers() if n.endswith(".router.expert_bias")]
    return [*model.named_parameters(), *buffers]


def megatron_param_layout(chunks: list, state: ParallelState) -> list[ParamInfo]:
    """Every parameter of this rank's chunks with its global name and TP split.

    ``state`` is accepted for symmetry with the other engine helpers (the layer offsets
    come from the modules themselves, so PP and VPP are both covered).
    """
    infos = []
    for index, chunk in enumerate(chunks):
        model = unwrap(chunk)
        layer_map = global_layer_names(model)
        num_experts = getattr(model.config, "num_moe_experts", None) or 0
        expert_offset = state.ep_rank * (num_experts // state.ep_size)
        for local_name, param in _weights(model):
            # Routed experts (not the shared expert) live under mlp.experts; megatron's
            # allreduce=False marks them only when EP > 1, so the name decides.
            expert = ".mlp.experts." in local_name
            size = state.etp_size if expert else state.tp_size
            split = getattr(param, "tensor_model_parallel", False) and size > 1
            tp_dim = param.partition_dim if split else None
            name = canonical_name(local_name, layer_map, expert_offset)
            layout = "gate_up" if tp_dim is not None and name.endswith("linear_fc1.weight") else "contiguous"
            infos.append(ParamInfo(index, local_name, name, tp_dim, layout, param, expert))
    return infos
