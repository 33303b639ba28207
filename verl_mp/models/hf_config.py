"""HF ``config.json`` -> `GPTSpec`, refusing every setting the engine would silently get wrong."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_mp.models.registry import Architecture, get_architecture
from verl_mp.models.spec import GPTSpec, MoESpec

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _as_dict(hf_config: Any) -> dict:
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    raise TypeError(f"expected an HF config (PretrainedConfig or dict), got {type(hf_config).__name__}")


def spec_from_hf_config(hf_config: Any, source: str = "config.json") -> GPTSpec:
    """Read an HF config (a ``PretrainedConfig`` or the ``config.json`` dict) into a GPTSpec.

    Accepts both the transformers-5 layout (``rope_parameters``) and the 4.x one
    (``rope_theta`` + ``rope_scaling``). Raises ValueError naming ``source`` and the field
    for anything unsupported (unknown architecture, non-SiLU activation, biases the
    megatron layout cannot hold, per-layer sliding windows, YaRN/dynamic rope, ...).
    """
    d = _as_dict(hf_config)
    archs = d.get("architectures") or []
    if not archs:
        raise ValueError(f"{source}: 'architectures' is missing; set it to e.g. ['LlamaForCausalLM']")
    arch = get_architecture(archs[0], source)
    if d.get("model_type") not in (None, arch.model_type):
        raise ValueError(f"{source}: model_type={d.get('model_type')!r} does not match {arch.name} "
                         f"(expected {arch.model_type!r})")
    _check_unsupported(d, arch, source)
    rope = _rope_settings(d, source)
    heads = d["num_attention_heads"]
    return GPTSpec(
        num_layers=d["num_hidden_layers"],
        hidden_size=d["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=d.get("num_key_value_heads") or heads,
        ffn_hidden_size=d["intermediate_size"],
        vocab_size=d["vocab_size"],
        max_position_embeddings=d.get("max_position_embeddings", 4096),
        kv_channels=d.get("head_dim") or d["hidden_size"] // heads,
        norm_epsilon=d.get("rms_norm_eps", 1e-6),
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)) and not arch.value_head,
        architecture=arch.name,
        sliding_window=_sliding_window(d, arch, source),
        value_head=arch.value_head,
        moe=_moe_spec(d, arch, source),
        **rope,
    )


def _num_experts(d: dict, source: str) -> int:
    """``num_experts`` (Qwen hub configs) or ``num_local_experts`` (Mixtral; transformers 5 saves
    Qwen3-MoE with it too)."""
    values = {d[k] for k in ("num_experts", "num_local_experts") if d.get(k) is not None}
    if len(values) != 1:
        raise ValueError(f"{source}: expected one number of experts in num_experts/num_local_experts, "
                         f"got {sorted(values)}")
    return values.pop()


def _moe_spec(d: dict, arch: Architecture, source: str) -> MoESpec | None:
    """The MoE MLP of ``arch``; refuses layouts the engine does not build (dense layers mixed in,
    router jitter)."""
    if arch.moe is None:
        return None
    if arch.moe == "mixtral":
        if d.get("router_jitter_noise", 0.0):
            raise ValueError(f"{source}: router_jitter_noise={d['router_jitter_noise']} is not supported "
                             f"(it perturbs the hidden states in training); set it to 0")
        ffn, norm_topk = d["intermediate_size"], True
    else:
        if d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1:
            raise ValueError(f"{source}: dense layers between MoE layers (mlp_only_layers="
                             f"{d.get('mlp_only_layers')}, decoder_sparse_step={d.get('decoder_sparse_step')}) "
                             f"are not supported; every layer must be a MoE layer")
        ffn, norm_topk = d["moe_intermediate_size"], bool(d.get("norm_topk_prob", False))
    shared = None
    if arch.moe == "qwen2_moe":
        if not d.get("qkv_bias", True):
            raise ValueError(f"{source}: qkv_bias=false is not supported for {arch.name}")
        shared = d["shared_expert_intermediate_size"]
    return MoESpec(num_experts=_num_experts(d, source), top_k=d["num_experts_per_tok"], ffn_hidden_size=ffn,
                   norm_topk_prob=norm_topk, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=shared is not None)


def _check_unsupported(d: dict, arch: Architecture, source: str) -> None:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{source}: hidden_act={act!r} is not supported (SwiGLU with 'silu' only)")
    if d.get("attention_bias", False) and not _qkv_bias_only(d, arch):
        raise ValueError(f"{source}: attention_bias=True (bias on q/k/v/o projections) is not supported "
                         f"for {arch.name}; only q/k/v biases are (an architecture registered with "
                         "qkv_bias=True, and attention_out_bias=false when the config has that key)")
    if d.get("mlp_bias", False):
        raise ValueError(f"{source}: mlp_bias=True is not supported")
    if d.get("num_attention_heads", 0) % (d.get("num_key_value_heads") or d.get("num_attention_heads", 1)):
        raise ValueError(f"{source}: num_key_value_heads must divide num_attention_heads")


def _qkv_bias_only(d: dict, arch: Architecture) -> bool:
    """``attention_bias`` means q/k/v biases only where the architecture has them and the
    config turns the output projection's bias off separately (Seed-OSS: attention_out_bias)."""
    return arch.qkv_bias and d.get("attention_out_bias") is False


def _sliding_window(d: dict, arch: Architecture, source: str) -> int | None:
    if arch.sliding_window == "always":
        return d.get("sliding_window")
    if arch.sliding_window == "flag" and d.get("use_sliding_window", False):
        raise ValueError(f"{source}: use_sliding_window=True (per-layer sliding windows) is not "
                         f"supported for {arch.name}; set it to false")
    return None


def _rope_settings(d: dict, source: str) -> dict:
    params = dict(d.get("rope_parameters") or {})
    legacy = d.get("rope_scaling") or {}
    params = {**legacy, **params}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: rope type {rope_type!r} is not supported; supported: "
                         f"{SUPPORTED_ROPE_TYPES}")
    if params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor != 1 is not supported")
    out = dict(rotary_base=float(params.get("rope_theta", d.get("rope_theta", 10000.0))), rope_type=rope_type)
    if rope_type in ("linear", "llama3"):
        out["rope_scaling_factor"] = float(params["factor"])
    if rope_type == "llama3":
        out["rope_low_freq_factor"] = float(params["low_freq_factor"])
        out["rope_high_freq_factor"] = float(params["high_freq_factor"])
        out["rope_original_max_position_embeddings"] = int(
            params.get("original_max_position_embeddings", d.get("max_position_embeddings", 8192))
        )
    return out
