"""HF ``config.json`` -> `GPTSpec`, refusing every setting the engine would silently get wrong."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_mp.models.registry import Architecture, get_architecture
from verl_mp.models.spec import GPTSpec, MLASpec, MoESpec, YarnSpec

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _as_dict(hf_config: Any) -> dict:
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    raise TypeError(f"expected an HF config (PretrainedConfig or dict), got {type(hf_config).__name__}")


def spec_from_model_dir(path: str) -> GPTSpec:
    """The `GPTSpec` of the HF checkpoint directory ``path`` (its config.json)."""
    from transformers import AutoConfig  # start-up cost (~1 s): not on the config-error path

    return spec_from_hf_config(AutoConfig.from_pretrained(path), source=os.path.join(path, "config.json"))


def spec_from_hf_config(hf_config: Any, source: str = "config.json") -> GPTSpec:
    """Read an HF config (a ``PretrainedConfig`` or the ``config.json`` dict) into a GPTSpec.

    Accepts both the transformers-5 layout (``rope_parameters``) and the 4.x one
    (``rope_theta`` + ``rope_scaling``). Raises ValueError naming ``source`` and the field
    for anything unsupported (unknown architecture, non-SiLU activation, biases the
    megatron layout cannot hold, per-layer sliding windows, dynamic rope, YaRN outside
    multi-latent attention, ...).
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
    mla = _mla_spec(d, arch, source)
    rope = _rope_settings(d, source, yarn_ok=mla is not None)
    heads = d["num_attention_heads"]
    return GPTSpec(
        num_layers=d["num_hidden_layers"],
        hidden_size=d["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=d.get("num_key_value_heads") or heads,
        ffn_hidden_size=d["intermediate_size"],
        vocab_size=d["vocab_size"],
        max_position_embeddings=d.get("max_position_embeddings", 4096),
        kv_channels=mla.qk_rope_head_dim if mla else d.get("head_dim") or d["hidden_size"] // heads,
        norm_epsilon=d.get("rms_norm_eps", 1e-6),
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)) and not arch.value_head,
        architecture=arch.name,
        sliding_window=_sliding_window(d, arch, source),
        value_head=arch.value_head,
        moe=_moe_spec(d, arch, source),
        mla=mla,
        **rope,
    )


def _num_experts(d: dict, source: str) -> int:
    """``num_experts`` (Qwen hub configs), ``num_local_experts`` (Mixtral; transformers 5 saves
    Qwen3-MoE with it too) or ``n_routed_experts`` (DeepSeek-V3)."""
    values = {d[k] for k in ("num_experts", "num_local_experts", "n_routed_experts") if d.get(k) is not None}
    if len(values) != 1:
        raise ValueError(f"{source}: expected one number of experts in num_experts/num_local_experts, "
                         f"got {sorted(values)}")
    return values.pop()


def _moe_spec(d: dict, arch: Architecture, source: str) -> MoESpec | None:
    """The MoE MLP of ``arch``; refuses layouts the engine does not build (dense layers mixed in,
    router jitter)."""
    if arch.moe is None:
        return None
    if arch.moe == "deepseek_v3":
        return _deepseek_moe_spec(d, source)
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


def _deepseek_moe_spec(d: dict, source: str) -> MoESpec:
    """DeepSeek-V3's router and MLP layout, refusing what megatron's sigmoid router computes
    differently: it always renormalises the top-k (k > 1) and scores a group by the sum of its
    ``top_k // topk_group`` best experts, where HF renormalises only with ``norm_topk_prob`` and
    always sums a group's best two."""
    top_k, num_experts = d["num_experts_per_tok"], _num_experts(d, source)
    norm = bool(d.get("norm_topk_prob", True))
    if norm != (top_k > 1):
        raise ValueError(f"{source}: norm_topk_prob={norm} with num_experts_per_tok={top_k} is not supported "
                         f"(megatron's sigmoid router renormalises the chosen weights exactly when top-k > 1); "
                         f"set norm_topk_prob={top_k > 1}")
    groups, group_topk = d.get("n_group") or 1, d.get("topk_group") or 1
    if groups > 1 and top_k // group_topk != 2:
        raise ValueError(f"{source}: group-limited routing with num_experts_per_tok={top_k} and "
                         f"topk_group={group_topk} is not supported: HF scores each group by its best 2 "
                         f"experts, megatron by its best num_experts_per_tok // topk_group = {top_k // group_topk}; "
                         f"use a topk_group with num_experts_per_tok // topk_group == 2, or n_group=1")
    if num_experts % groups:
        raise ValueError(f"{source}: n_group={groups} must divide n_routed_experts={num_experts}")
    first_dense = d.get("first_k_dense_replace") or 0
    if not 0 <= first_dense < d["num_hidden_layers"]:
        raise ValueError(f"{source}: first_k_dense_replace={first_dense} must be in [0, num_hidden_layers)")
    shared = d.get("n_shared_experts") or 0
    return MoESpec(
        num_experts=num_experts, top_k=top_k, ffn_hidden_size=d["moe_intermediate_size"], norm_topk_prob=norm,
        shared_expert_ffn_hidden_size=shared * d["moe_intermediate_size"] if shared else None,
        score_function="sigmoid", expert_bias=True,
        scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
        num_groups=groups if groups > 1 else None, group_topk=group_topk if groups > 1 else None,
        first_dense_layers=first_dense,
    )


def _mla_spec(d: dict, arch: Architecture, source: str) -> MLASpec | None:
    """Multi-latent attention dimensions; refuses the layouts megatron's MLA computes differently."""
    if not arch.mla:
        return None
    params, rope_type = _rope_params(d)
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"{source}: rope type {rope_type!r} (rope_scaling/rope_parameters) is not supported "
                         f"for multi-latent attention; only plain RoPE and 'yarn' (DeepSeek-V3's) are")
    if not d.get("rope_interleave", True):
        raise ValueError(f"{source}: rope_interleave=false is not supported (megatron's multi-latent "
                         f"attention rotates interleaved pairs); use a checkpoint with rope_interleave=true")
    if d.get("num_key_value_heads") not in (None, d["num_attention_heads"]):
        raise ValueError(f"{source}: num_key_value_heads={d['num_key_value_heads']} must equal "
                         f"num_attention_heads for multi-latent attention")
    return MLASpec(q_lora_rank=d.get("q_lora_rank"), kv_lora_rank=d["kv_lora_rank"],
                   qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
                   v_head_dim=d["v_head_dim"],
                   yarn=_yarn_spec(d, params, source) if rope_type == "yarn" else None)


def _yarn_spec(d: dict, params: dict, source: str) -> YarnSpec:
    """HF's YaRN (transformers' ``_compute_yarn_parameters`` and DeepSeek-V3's softmax
    ``yarn_apply_mscale``) as megatron's MLA computes it, refusing what megatron computes otherwise."""
    if params.get("factor") is None:
        raise ValueError(f"{source}: rope_scaling type 'yarn' needs 'factor' (DeepSeek-V3: 40)")
    if params.get("attention_factor") is not None:
        raise ValueError(f"{source}: rope_scaling.attention_factor is not supported for multi-latent attention "
                         f"(megatron derives it from factor, mscale and mscale_all_dim); remove it")
    if params.get("truncate", True) is False:
        raise ValueError(f"{source}: rope_scaling.truncate=false is not supported (megatron rounds YaRN's "
                         f"correction range to whole dimensions); remove it")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale_all_dim and not mscale:
        raise ValueError(f"{source}: rope_scaling.mscale_all_dim={mscale_all_dim} with mscale={mscale!r} is not "
                         f"supported (HF then scales cos/sin by m(factor) alone, megatron by "
                         f"m(factor, mscale) / m(factor, mscale_all_dim)); set mscale")
    if not (mscale and mscale_all_dim):
        # HF: cos/sin times m(factor, 1), softmax unscaled; megatron computes the same with (1, 0)
        mscale, mscale_all_dim = 1.0, 0.0
    return YarnSpec(factor=float(params["factor"]),
                    original_max_position_embeddings=int(params.get("original_max_position_embeddings")
                                                         or d.get("max_position_embeddings", 4096)),
                    beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                    mscale=float(mscale), mscale_all_dim=float(mscale_all_dim))


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


def _rope_params(d: dict) -> tuple[dict, str]:
    """The merged rope parameters (transformers-5 ``rope_parameters`` over 4.x ``rope_scaling``)
    and the rope type."""
    params = {**(d.get("rope_scaling") or {}), **(d.get("rope_parameters") or {})}
    return params, params.get("rope_type", params.get("type", "default"))


def _rope_settings(d: dict, source: str, yarn_ok: bool = False) -> dict:
    """``yarn_ok``: multi-latent attention, whose YaRN parameters `_mla_spec` reads."""
    params, rope_type = _rope_params(d)
    if rope_type not in SUPPORTED_ROPE_TYPES and not (yarn_ok and rope_type == "yarn"):
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
