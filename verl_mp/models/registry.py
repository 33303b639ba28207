"""Supported Hugging Face architectures: an explicit name/layout map per HF ``architectures[0]``.

Each `Architecture` lists, as data, which HF tensors make up each megatron parameter and
how (`TensorRule`). Names use ``{i}`` for the *global* layer index and ``{e}`` for the
*global* expert index (mixture-of-experts layers: megatron's local expert ``k`` on
expert-parallel rank ``r`` is global expert ``r * num_experts / EP + k``). The conversion
functions that apply these rules live in `verl_mp.models.convert`.

Rule kinds (layouts of the megatron tensor, TP=1, unpadded vocabulary):

- ``copy``:  the HF tensor as is.
- ``qkv``:   fused QKV, interleaved per query group: for group g, the rows
  ``[q heads of g (heads_per_group * head_dim); k_g (head_dim); v_g (head_dim)]``.
- ``fc1``:   fused SwiGLU input projection ``[gate; up]``.
- ``vocab``: embedding / LM head rows; megatron pads them to a TP multiple (see
  `verl_mp.models.convert.tp_shard_plan`), HF never sees the padding.

``tp_dim`` is the dimension megatron splits over tensor-parallel ranks (None: replicated);
for routed experts (``{e}`` rules) the split is over the *expert*-TP ranks.

``when`` limits a rule to some layers or configs (`verl_mp.models.convert.rule_applies`):
``dense_layer`` / ``moe_layer`` (DeepSeek-V3's first dense layers), ``q_lora`` / ``no_q_lora``
(multi-latent attention with or without the low-rank query projection).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.models.spec import GPTSpec


@dataclass(frozen=True)
class TensorRule:
    megatron: str
    hf: tuple[str, ...]
    kind: str
    tp_dim: int | None
    when: str | None = None
    """None: every layer; else one of `RULE_CONDITIONS`."""


RULE_CONDITIONS = ("dense_layer", "moe_layer", "q_lora", "no_q_lora")


@dataclass(frozen=True)
class Architecture:
    name: str
    """HF ``architectures[0]``, e.g. ``LlamaForCausalLM``."""
    model_type: str
    """The config's ``model_type`` that must go with it."""
    rules: tuple[TensorRule, ...]
    qkv_bias: bool = False
    """Q/K/V projections always carry a bias (Qwen2)."""
    qk_norm: bool = False
    """Per-head RMSNorm on queries and keys (Qwen3)."""
    sliding_window: str = "never"
    """How the config's ``sliding_window`` applies: ``never``, ``always`` (Mistral) or
    ``flag`` (only with ``use_sliding_window=True``; Qwen2/3, refused: per-layer windows)."""
    value_head: bool = False
    """``*ForTokenClassification`` critic checkpoints: ``score`` head instead of ``lm_head``."""
    moe: str | None = None
    """How the config describes its mixture-of-experts MLP (`verl_mp.models.hf_config`):
    ``qwen2_moe`` (shared expert with a sigmoid gate), ``qwen3_moe``, ``mixtral``, ``deepseek_v3``
    (sigmoid router with expert bias, shared experts, dense first layers); None: dense."""
    mla: bool = False
    """Multi-latent attention (DeepSeek-V3; `verl_mp.models.spec.MLASpec`)."""


_L, _H = "decoder.layers.{i}.", "model.layers.{i}."

_EMBEDDING = TensorRule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab", 0)
_FINAL_NORM = TensorRule("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", None)
_LM_HEAD = TensorRule("output_layer.weight", ("lm_head.weight",), "vocab", 0)
_VALUE_HEAD = (
    TensorRule("output_layer.weight", ("score.weight",), "copy", None),
    TensorRule("output_layer.bias", ("score.bias",), "copy", None),
)
_LAYER = (
    TensorRule(_L + "input_layernorm.weight", (_H + "input_layernorm.weight",), "copy", None),
    TensorRule(
        _L + "self_attention.linear_qkv.weight",
        (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"),
        "qkv", 0,
    ),
    TensorRule(_L + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",), "copy", 1),
    TensorRule(_L + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",), "copy", None),
    TensorRule(
        _L + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"), "fc1", 0
    ),
    TensorRule(_L + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), "copy", 1),
)
_QKV_BIAS = TensorRule(
    _L + "self_attention.linear_qkv.bias",
    (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
    "qkv", 0,
)
_QK_NORM = (
    TensorRule(_L + "self_attention.q_layernorm.weight", (_H + "self_attn.q_norm.weight",), "copy", None),
    TensorRule(_L + "self_attention.k_layernorm.weight", (_H + "self_attn.k_norm.weight",), "copy", None),
)

LLAMA_RULES = (_EMBEDDING, _FINAL_NORM, _LM_HEAD, *_LAYER)
QWEN2_RULES = (*LLAMA_RULES, _QKV_BIAS)
QWEN3_RULES = (*LLAMA_RULES, *_QK_NORM)
MISTRAL_RULES = LLAMA_RULES

# Mixture-of-experts MLPs. Routed experts are megatron SequentialMLP experts named by their
# global index; the router is `mlp.router`, Qwen2-MoE's shared expert `mlp.shared_experts`.
_ATTENTION = tuple(r for r in _LAYER if ".mlp." not in r.megatron)
_E = _L + "mlp.experts.{e}."


def _moe_rules(router: str, gate: str, up: str, down: str) -> tuple[TensorRule, ...]:
    """Router + routed-expert rules; ``gate``/``up``/``down`` are HF names under ``model.layers.{i}.``."""
    return (
        TensorRule(_L + "mlp.router.weight", (_H + router,), "copy", None),
        TensorRule(_E + "linear_fc1.weight", (_H + gate, _H + up), "fc1", 0),
        TensorRule(_E + "linear_fc2.weight", (_H + down,), "copy", 1),
    )


_QWEN_EXPERTS = _moe_rules("mlp.gate.weight", "mlp.experts.{e}.gate_proj.weight",
                           "mlp.experts.{e}.up_proj.weight", "mlp.experts.{e}.down_proj.weight")
_QWEN2_SHARED_EXPERT = (
    TensorRule(_L + "mlp.shared_experts.linear_fc1.weight",
               (_H + "mlp.shared_expert.gate_proj.weight", _H + "mlp.shared_expert.up_proj.weight"), "fc1", 0),
    TensorRule(_L + "mlp.shared_experts.linear_fc2.weight", (_H + "mlp.shared_expert.down_proj.weight",), "copy", 1),
    TensorRule(_L + "mlp.shared_experts.gate_weight", (_H + "mlp.shared_expert_gate.weight",), "copy", None),
)
# Mixtral checkpoints keep the original names: w1 = gate, w3 = up, w2 = down.
_MIXTRAL_EXPERTS = _moe_rules("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight",
                              "block_sparse_moe.experts.{e}.w3.weight", "block_sparse_moe.experts.{e}.w2.weight")

_MOE_BASE = (_EMBEDDING, _FINAL_NORM, _LM_HEAD, *_ATTENTION)
QWEN3_MOE_RULES = (*_MOE_BASE, *_QK_NORM, *_QWEN_EXPERTS)
QWEN2_MOE_RULES = (*_MOE_BASE, _QKV_BIAS, *_QWEN_EXPERTS, *_QWEN2_SHARED_EXPERT)
MIXTRAL_RULES = (*_MOE_BASE, *_MIXTRAL_EXPERTS)


# DeepSeek-V3: multi-latent attention (megatron's MLASelfAttention; the down projections
# replicated on the TP ranks, the others split by heads), then a
# dense MLP in the first layers and an MoE MLP (sigmoid router with its expert-bias buffer,
# routed experts, always-on shared experts) in the others.
_A, _HA = _L + "self_attention.", _H + "self_attn."
_MLA = (
    TensorRule(_A + "linear_q_proj.weight", (_HA + "q_proj.weight",), "copy", 0, when="no_q_lora"),
    TensorRule(_A + "linear_q_down_proj.weight", (_HA + "q_a_proj.weight",), "copy", None, when="q_lora"),
    TensorRule(_A + "q_layernorm.weight", (_HA + "q_a_layernorm.weight",), "copy", None, when="q_lora"),
    TensorRule(_A + "linear_q_up_proj.weight", (_HA + "q_b_proj.weight",), "copy", 0, when="q_lora"),
    TensorRule(_A + "linear_kv_down_proj.weight", (_HA + "kv_a_proj_with_mqa.weight",), "copy", None),
    TensorRule(_A + "kv_layernorm.weight", (_HA + "kv_a_layernorm.weight",), "copy", None),
    TensorRule(_A + "linear_kv_up_proj.weight", (_HA + "kv_b_proj.weight",), "copy", 0),
    TensorRule(_A + "linear_proj.weight", (_HA + "o_proj.weight",), "copy", 1),
)
_NORMS = tuple(r for r in _LAYER if r.megatron.endswith("layernorm.weight"))
_DENSE_MLP = tuple(TensorRule(r.megatron, r.hf, r.kind, r.tp_dim, when="dense_layer")
                   for r in _LAYER if ".mlp." in r.megatron)
_DEEPSEEK_MOE = tuple(TensorRule(r.megatron, r.hf, r.kind, r.tp_dim, when="moe_layer") for r in (
    *_QWEN_EXPERTS,
    TensorRule(_L + "mlp.router.expert_bias", (_H + "mlp.gate.e_score_correction_bias",), "copy", None),
    TensorRule(_L + "mlp.shared_experts.linear_fc1.weight",
               (_H + "mlp.shared_experts.gate_proj.weight", _H + "mlp.shared_experts.up_proj.weight"), "fc1", 0),
    TensorRule(_L + "mlp.shared_experts.linear_fc2.weight", (_H + "mlp.shared_experts.down_proj.weight",),
               "copy", 1),
))
DEEPSEEK_V3_RULES = (_EMBEDDING, _FINAL_NORM, _LM_HEAD, *_NORMS, *_MLA, *_DENSE_MLP, *_DEEPSEEK_MOE)

FP32_HF_TENSORS = ("e_score_correction_bias",)
"""HF tensor name suffixes kept in fp32 whatever the checkpoint dtype (HF keeps DeepSeek-V3's
routing bias in fp32: ``_keep_in_fp32_modules_strict``; megatron's ``expert_bias`` is fp32)."""
FP32_MEGATRON_TENSORS = tuple(sorted({r.megatron.removeprefix(_L) for r in DEEPSEEK_V3_RULES
                                      if any(h.endswith(FP32_HF_TENSORS) for h in r.hf)}))
"""The megatron name suffixes of `FP32_HF_TENSORS` (from the rules): the weight sync moves them
in fp32 too (vLLM and SGLang hold the routing bias in fp32; rounding it to bf16 on the way
changes which experts the rollout picks)."""


def _critic(rules: tuple[TensorRule, ...]) -> tuple[TensorRule, ...]:
    return tuple(r for r in rules if r is not _LM_HEAD) + _VALUE_HEAD


_BASES = (
    ("Llama", "llama", LLAMA_RULES, dict()),
    ("Qwen2", "qwen2", QWEN2_RULES, dict(qkv_bias=True, sliding_window="flag")),
    ("Qwen3", "qwen3", QWEN3_RULES, dict(qk_norm=True, sliding_window="flag")),
    ("Mistral", "mistral", MISTRAL_RULES, dict(sliding_window="always")),
    ("Qwen2Moe", "qwen2_moe", QWEN2_MOE_RULES, dict(qkv_bias=True, sliding_window="flag", moe="qwen2_moe")),
    ("Qwen3Moe", "qwen3_moe", QWEN3_MOE_RULES, dict(qk_norm=True, sliding_window="flag", moe="qwen3_moe")),
    ("Mixtral", "mixtral", MIXTRAL_RULES, dict(sliding_window="always", moe="mixtral")),
    ("DeepseekV3", "deepseek_v3", DEEPSEEK_V3_RULES, dict(moe="deepseek_v3", mla=True)),
)

ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> None:
    """Add an architecture; a duplicate name raises."""
    if arch.name in ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} is already registered")
    ARCHITECTURES[arch.name] = arch


for _prefix, _model_type, _rules, _flags in _BASES:
    register_architecture(Architecture(f"{_prefix}ForCausalLM", _model_type, _rules, **_flags))
    register_architecture(
        Architecture(f"{_prefix}ForTokenClassification", _model_type, _critic(_rules), value_head=True, **_flags)
    )


def get_architecture(name: str, source: str = "config.json") -> Architecture:
    """The registered architecture for HF ``architectures[0]``; unknown names list the valid ones."""
    if name not in ARCHITECTURES:
        raise ValueError(
            f"{source}: architecture {name!r} is not supported; supported architectures: "
            f"{sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[name]


def rules_for(spec: GPTSpec) -> tuple[TensorRule, ...]:
    """The name/layout rules of ``spec.architecture`` (for the critic: with the value head)."""
    if spec.architecture is None:
        raise ValueError("GPTSpec.architecture is None: HF conversion needs a spec from spec_from_hf_config")
    arch = get_architecture(spec.architecture, source="GPTSpec.architecture")
    if spec.value_head and not arch.value_head:
        return _critic(arch.rules)
    return arch.rules


def causal_lm_to_critic_name(name: str) -> str:
    """``LlamaForCausalLM`` -> ``LlamaForTokenClassification`` (the exported critic's class)."""
    return name.replace("ForCausalLM", "ForTokenClassification")
