"""Pure per-tensor conversion between HF and megatron layouts (no I/O, no process groups).

Conventions (see docs/engine.md):

- A *megatron name* is the global parameter name of an unwrapped GPTModel with the
  global layer index, e.g. ``decoder.layers.3.self_attention.linear_qkv.weight``.
- A *full* megatron tensor is the TP=1 tensor with the **unpadded** vocabulary: fused
  QKV interleaved per query group, fused fc1 ``[gate; up]``. `verl_mp.engine.layout`
  turns TP shards into full tensors (``ParamInfo.merge_tp_shards``) and back.
- With tied embeddings, ``output_layer.weight`` (present on the last pipeline stage when
  PP > 1) is a copy of the embedding: it loads from ``model.embed_tokens.weight`` and
  exports to nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from verl_mp.models.registry import FP32_HF_TENSORS, RULE_CONDITIONS, TensorRule, rules_for
from verl_mp.models.spec import GPTSpec, padded_vocab_size

TIED_OUTPUT = "output_layer.weight"
EMBEDDING = "embedding.word_embeddings.weight"


@lru_cache(maxsize=64)
def _pattern(template: str) -> re.Pattern:
    escaped = re.escape(template)
    for key in ("i", "e"):
        escaped = escaped.replace(r"\{" + key + r"\}", f"(?P<{key}>\\d+)")
    return re.compile("^" + escaped + "$")


def rule_applies(spec: GPTSpec, rule: TensorRule, layer: int | None) -> bool:
    """Whether ``rule`` holds for global layer ``layer`` (None outside layers) of ``spec``
    (`verl_mp.models.registry.TensorRule.when`)."""
    if rule.when is None:
        return True
    if rule.when in ("dense_layer", "moe_layer"):
        moe = spec.moe is not None and layer is not None and spec.moe.is_moe_layer(layer)
        return moe == (rule.when == "moe_layer")
    if rule.when in ("q_lora", "no_q_lora"):
        q_lora = spec.mla is not None and spec.mla.q_lora_rank is not None
        return q_lora == (rule.when == "q_lora")
    raise ValueError(f"TensorRule.when={rule.when!r} is not one of {RULE_CONDITIONS}")


def match_rule(spec: GPTSpec, megatron_name: str) -> tuple[TensorRule, dict[str, int]]:
    """The rule for a global megatron name and its indices (``i``: layer, ``e``: expert; empty
    outside layers)."""
    for rule in rules_for(spec):
        m = _pattern(rule.megatron).match(megatron_name)
        if m:
            indices = {k: int(v) for k, v in m.groupdict().items()}
            if not rule_applies(spec, rule, indices.get("i")):
                continue
            if not 0 <= indices.get("i", 0) < spec.num_layers:
                break
            if "e" in indices and not (spec.moe and indices["e"] < spec.moe.num_experts):
                break
            return rule, indices
    raise KeyError(f"no HF mapping for megatron parameter {megatron_name!r} ({spec.architecture})")


def is_tied_copy(spec: GPTSpec, megatron_name: str) -> bool:
    """True for the last stage's copy of a tied embedding (exported as nothing)."""
    return spec.tie_word_embeddings and not spec.value_head and megatron_name == TIED_OUTPUT


def _source(spec: GPTSpec, megatron_name: str) -> tuple[TensorRule, dict[str, int]]:
    return match_rule(spec, EMBEDDING if is_tied_copy(spec, megatron_name) else megatron_name)


def hf_names(spec: GPTSpec, megatron_name: str) -> tuple[str, ...]:
    """HF tensors that make up one megatron parameter (the embedding for a tied head)."""
    rule, indices = _source(spec, megatron_name)
    return tuple(n.format(**indices) for n in rule.hf)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: GPTSpec) -> torch.Tensor:
    """``q [G*hpg*d, ...]``, ``k``/``v`` ``[G*d, ...]`` -> ``[G*(hpg+2)*d, ...]`` per-group interleave.

    G may be any number of whole groups (all of them, or one TP rank's slice).
    """
    d, hpg = spec.head_dim, spec.heads_per_group
    groups, tail = k.shape[0] // d, tuple(q.shape[1:])
    parts = (q.reshape(groups, hpg * d, *tail), k.reshape(groups, d, *tail), v.reshape(groups, d, *tail))
    return torch.cat(parts, dim=1).reshape(groups * (hpg + 2) * d, *tail)


def split_qkv(qkv: torch.Tensor, spec: GPTSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of `fuse_qkv`: ``[G*(hpg+2)*d, ...]`` -> contiguous ``(q, k, v)``."""
    d, hpg = spec.head_dim, spec.heads_per_group
    tail = tuple(qkv.shape[1:])
    groups = qkv.shape[0] // ((hpg + 2) * d)
    q, k, v = qkv.reshape(groups, (hpg + 2) * d, *tail).split([hpg * d, d, d], dim=1)
    return tuple(t.reshape(groups * t.shape[1], *tail).contiguous() for t in (q, k, v))


def hf_to_megatron(spec: GPTSpec, megatron_name: str, hf_tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Build one megatron tensor from its HF tensors (keyed by HF name).

    The HF tensors may be full (-> the full, unpadded megatron tensor) or one TP rank's
    slices from `tp_shard_plan` (-> that rank's shard, before vocabulary padding).
    """
    rule, _ = _source(spec, megatron_name)
    tensors = [hf_tensors[n] for n in hf_names(spec, megatron_name)]
    if rule.kind == "qkv":
        return fuse_qkv(*tensors, spec)
    if rule.kind == "fc1":
        return torch.cat(tensors, dim=0)
    return tensors[0]


def megatron_to_hf(spec: GPTSpec, megatron_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """One full megatron tensor -> ``[(hf_name, tensor), ...]`` (contiguous).

    ``tensor`` is TP-gathered in the TP=1 layout (``ParamInfo.merge_tp_shards``); vocabulary
    rows beyond ``spec.vocab_size`` (TP padding) are dropped. A tied head gives ``[]``.
    """
    if is_tied_copy(spec, megatron_name):
        return []
    rule, _ = match_rule(spec, megatron_name)
    names = hf_names(spec, megatron_name)
    if rule.kind == "qkv":
        return list(zip(names, split_qkv(tensor, spec), strict=True))
    if rule.kind == "fc1":
        gate, up = tensor.chunk(2, dim=0)
        return [(names[0], gate.contiguous()), (names[1], up.contiguous())]
    if rule.kind == "vocab":
        tensor = tensor[: spec.vocab_size]
    return [(names[0], tensor.contiguous())]


def megatron_global_names(spec: GPTSpec) -> list[str]:
    """Every global megatron parameter name of the model (tied head excluded)."""
    names = []
    for rule in rules_for(spec):
        if rule.megatron == TIED_OUTPUT and spec.tie_word_embeddings and not spec.value_head:
            continue
        layers = range(spec.num_layers) if "{i}" in rule.megatron else [None]
        experts = range(spec.moe.num_experts) if "{e}" in rule.megatron else [None]
        names += [rule.megatron.format(i=i, e=e) for i in layers if rule_applies(spec, rule, i) for e in experts]
    return names


def hf_export_dtype(hf_name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype an HF tensor is saved in: ``dtype``, except the tensors HF keeps in fp32."""
    return torch.float32 if hf_name.endswith(FP32_HF_TENSORS) else dtype


def hf_shape(spec: GPTSpec, hf_name: str) -> tuple[int, ...]:
    """The shape the config implies for one HF tensor."""
    h, d, f, v = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size, spec.vocab_size
    q_rows, kv_rows = spec.num_attention_heads * d, spec.num_query_groups * d
    by_suffix = {
        "embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "norm.weight": (h,),
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,), "q_proj.weight": (q_rows, h), "k_proj.weight": (kv_rows, h),
        "v_proj.weight": (kv_rows, h), "q_proj.bias": (q_rows,), "k_proj.bias": (kv_rows,),
        "v_proj.bias": (kv_rows,), "o_proj.weight": (h, q_rows), "q_norm.weight": (d,),
        "k_norm.weight": (d,), "gate_proj.weight": (f, h), "up_proj.weight": (f, h),
        "down_proj.weight": (h, f), "score.weight": (1, h), "score.bias": (1,),
    }
    key = ".".join(hf_name.split(".")[-2:])
    if spec.moe is not None:
        by_suffix.update(_moe_shapes(spec, hf_name))
    if spec.mla is not None:
        by_suffix.update(_mla_shapes(spec))
    if key not in by_suffix:
        raise KeyError(f"no shape rule for HF tensor {hf_name!r}")
    return by_suffix[key]


def _moe_shapes(spec: GPTSpec, hf_name: str) -> dict[str, tuple[int, ...]]:
    """Shapes of MoE tensors by name suffix; expert/shared-expert projections by their own size."""
    h, moe = spec.hidden_size, spec.moe
    shapes = {"gate.weight": (moe.num_experts, h), "shared_expert_gate.weight": (1, h),
              "gate.e_score_correction_bias": (moe.num_experts,)}
    if ".experts." in hf_name:
        f = moe.ffn_hidden_size
    elif ".shared_expert." in hf_name or ".shared_experts." in hf_name:
        f = moe.shared_expert_ffn_hidden_size
    else:
        return shapes
    for up in ("gate_proj.weight", "up_proj.weight", "w1.weight", "w3.weight"):
        shapes[up] = (f, h)
    shapes["down_proj.weight"] = shapes["w2.weight"] = (h, f)
    return shapes


def _mla_shapes(spec: GPTSpec) -> dict[str, tuple[int, ...]]:
    """Shapes of the multi-latent attention tensors by name suffix."""
    h, n, m = spec.hidden_size, spec.num_attention_heads, spec.mla
    shapes = {
        "q_proj.weight": (n * m.q_head_dim, h), "o_proj.weight": (h, n * m.v_head_dim),
        "kv_a_proj_with_mqa.weight": (m.kv_lora_rank + m.qk_rope_head_dim, h),
        "kv_a_layernorm.weight": (m.kv_lora_rank,),
        "kv_b_proj.weight": (n * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
    }
    if m.q_lora_rank is not None:
        shapes.update({"q_a_proj.weight": (m.q_lora_rank, h), "q_a_layernorm.weight": (m.q_lora_rank,),
                       "q_b_proj.weight": (n * m.q_head_dim, m.q_lora_rank)})
    return shapes


def expected_hf_shapes(spec: GPTSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape implied by the config (what every checkpoint must contain)."""
    return {hf: hf_shape(spec, hf) for name in megatron_global_names(spec) for hf in hf_names(spec, name)}


@dataclass(frozen=True)
class SliceRead:
    """Read ``hf_name[start:stop]`` along ``dim`` (``dim=None``: the whole tensor)."""

    hf_name: str
    dim: int | None = None
    start: int = 0
    stop: int = 0


@dataclass(frozen=True)
class ShardPlan:
    """How one TP rank builds its megatron shard from HF slices.

    ``hf_to_megatron(spec, name, {read.hf_name: tensor})`` over the reads gives the shard;
    then ``pad_rows`` zero rows are appended (vocabulary padding on the last TP rank).
    """

    reads: tuple[SliceRead, ...]
    pad_rows: int = 0


def tp_shard_plan(spec: GPTSpec, megatron_name: str, tp_rank: int, tp_size: int) -> ShardPlan:
    """The HF slices that make up TP rank ``tp_rank``'s shard of one megatron parameter."""
    rule, _ = _source(spec, megatron_name)
    names = hf_names(spec, megatron_name)
    if rule.tp_dim is None or tp_size == 1 and rule.kind != "vocab":
        return ShardPlan(tuple(SliceRead(n) for n in names))
    if rule.kind == "vocab":
        per_rank = padded_vocab_size(spec.vocab_size, tp_size) // tp_size
        start = min(tp_rank * per_rank, spec.vocab_size)
        stop = min(start + per_rank, spec.vocab_size)
        return ShardPlan((SliceRead(names[0], 0, start, stop),), pad_rows=per_rank - (stop - start))
    if rule.kind == "qkv":
        groups = spec.num_query_groups // tp_size
        d, hpg = spec.head_dim, spec.heads_per_group
        g0 = tp_rank * groups
        q = SliceRead(names[0], 0, g0 * hpg * d, (g0 + groups) * hpg * d)
        kv = [SliceRead(n, 0, g0 * d, (g0 + groups) * d) for n in names[1:]]
        return ShardPlan((q, *kv))
    size = hf_shape(spec, names[0])[rule.tp_dim] // tp_size
    return ShardPlan(tuple(SliceRead(n, rule.tp_dim, tp_rank * size, (tp_rank + 1) * size) for n in names))

