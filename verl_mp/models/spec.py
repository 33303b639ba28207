"""An architecture-neutral description of a decoder-only transformer.

Each supported HF architecture converts its config into a `GPTSpec` (see
`verl_mp/models/`), and the engine builds a megatron GPTModel from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.config.parallel import ModelShape


@dataclass(frozen=True, kw_only=True)
class GPTSpec:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    """The tokenizer's (unpadded) vocabulary size; the engine pads it to a TP multiple."""
    max_position_embeddings: int = 4096
    kv_channels: int | None = None
    """Head dimension; None means hidden_size // num_attention_heads."""
    norm_epsilon: float = 1e-6
    rotary_base: float = 10000.0
    rope_scaling_factor: float | None = None
    """Llama-3.1 style rope scaling factor; None disables it."""
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    tie_word_embeddings: bool = False
    gated_linear_unit: bool = True
    """SwiGLU MLP (Llama/Qwen/Mistral)."""

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups,
            vocab_size=self.vocab_size,
        )

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads


def padded_vocab_size(vocab_size: int, tp_size: int, multiple: int = 1) -> int:
    """Vocabulary padded so every TP rank holds an equal slice (Megatron requirement)."""
    step = tp_size * multiple
    return -(-vocab_size // step) * step
