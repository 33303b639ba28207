"""The shapes of the real models the presets in megatron_configs/ are sized for: their HF
config.json fields from the published hyperparameters (no weights, no download), so that
`verl-mp plan --config-name <preset>` plans a preset without a checkpoint at hand.

A real-model preset names its model on its first line (``# Qwen2.5-7B (7.6B, untied), GRPO,
8 GPUs of 80 GB ...``, checked by tests/unit/test_planner_presets.py); `preset_model` reads it.
"""

from __future__ import annotations

import re

from verl_mp.config.loader import preset_path

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
}
HF_REPOS = {
    "Qwen2-1.5B": "Qwen/Qwen2-1.5B-Instruct", "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct", "Qwen3-32B": "Qwen/Qwen3-32B",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct", "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
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
