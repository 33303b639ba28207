"""The shapes of the real models the presets in megatron_configs/ are sized for: their HF
config.json fields from the published hyperparameters (no weights, no download), so that
`verl-mp plan --config-name <preset>` plans a preset without a checkpoint at hand.

A real-model preset names its model on its first line (``# Qwen2.5-7B (7.6B, untied), GRPO,
8 GPUs of 80 GB ...``, checked by tests/unit/test_planner_presets.py); `preset_model` reads it.
"""

from __future__ import annotations

import re

from verl_mp.config.loader import preset_path

_YARN = dict(type="yarn", beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0,
             original_max_position_embeddings=4096)
_DEEPSEEK_V3 = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=7168,
                    intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                    num_nextn_predict_layers=1, n_shared_experts=1, num_experts_per_tok=8, norm_topk_prob=True,
                    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                    topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, rope_interleave=True,
                    hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False)
MODEL_CONFIGS = {
    "Qwen2-1.5B": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536,
                       intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       vocab_size=151936, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, use_sliding_window=False, hidden_act="silu"),
    "Qwen2.5-7B": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, use_sliding_window=False, hidden_act="silu"),
    "Qwen3-32B": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=5120,
                      intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, attention_bias=False,
                      hidden_act="silu"),
    "Llama-3.1-70B": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=8192,
                          intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                          vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=8192),
                          tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu"),
    "Qwen3-30B-A3B": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
                          max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, use_sliding_window=False, attention_bias=False,
                          router_aux_loss_coef=0.001, hidden_act="silu"),
    "Qwen3-235B-A22B": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=4096,
                            intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
                            num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                            num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                            vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                            attention_bias=False, router_aux_loss_coef=0.001, hidden_act="silu"),
    # DeepSeek-V3 / R1 (671B, 37B active) as its config.json; the MTP layer is not built (HF neither)
    "DeepSeek-V3": dict(_DEEPSEEK_V3, vocab_size=129280, num_attention_heads=128, num_key_value_heads=128,
                        n_routed_experts=256, routed_scaling_factor=2.5, n_group=8, topk_group=4,
                        first_k_dense_replace=3, max_position_embeddings=163840, rope_theta=10000.0,
                        rope_scaling=dict(_YARN, factor=40.0)),
    # Kimi-K2 (1T, 32B active) is this architecture at another shape; its own config.json says
    # model_type kimi_k2, which the registry does not take yet: here under DeepSeek-V3's model_type
    "Kimi-K2": dict(_DEEPSEEK_V3, vocab_size=163840, num_attention_heads=64, num_key_value_heads=64,
                    n_routed_experts=384, routed_scaling_factor=2.827, n_group=1, topk_group=1,
                    first_k_dense_replace=1, max_position_embeddings=131072, rope_theta=50000.0,
                    rope_scaling=dict(_YARN, factor=32.0)),
}
HF_REPOS = {
    "Qwen2-1.5B": "Qwen/Qwen2-1.5B-Instruct", "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct", "Qwen3-32B": "Qwen/Qwen3-32B",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct", "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3", "Kimi-K2": "moonshotai/Kimi-K2-Instruct",
}
"""Where each model's config.json is published (``https://huggingface.co/<repo>/blob/main/config.json``)."""

PRESET_HEADER = re.compile(r"^# (\S+) \(.*\), .+?, (\d+) GPUs of (80|141) GB")
"""A real-model preset's first line: model, algorithm, GPU count and size."""


def preset_model(config_name: str) -> str | None:
    """The model a preset's header names, or None (not a real-model preset, or not a preset)."""
    try:
        match = PRESET_HEADER.match(preset_path(config_name).read_text())
    except ValueError:
        return None
    return match.group(1) if match else None


def hf_config_url(model: str) -> str:
    return f"https://huggingface.co/{HF_REPOS[model]}/blob/main/config.json"
