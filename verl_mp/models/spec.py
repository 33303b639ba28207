"""An architecture-neutral description of a decoder-only transformer.

Each supported HF architecture converts its config into a `GPTSpec` (see
`verl_mp/models/`), and the engine builds a megatron GPTModel from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.config.parallel import ModelShape


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The mixture-of-experts MLP of every decoder layer (Qwen2/3-MoE, Mixtral).

    Routing (all three HF architectures): ``p = softmax(router(x))`` over all experts in
    fp32, the ``top_k`` largest are chosen, optionally renormalised to sum to 1
    (``norm_topk_prob``), and the chosen experts' SwiGLU outputs are summed with weights
    ``p``. A shared expert (Qwen2-MoE) runs on every token and is scaled by
    ``sigmoid(shared_expert_gate(x))``.
    """

    num_experts: int
    top_k: int
    ffn_hidden_size: int
    """Intermediate size of one routed expert (HF ``moe_intermediate_size``; Mixtral:
    ``intermediate_size``)."""
    norm_topk_prob: bool = True
    """Renormalise the chosen experts' probabilities to sum to 1 (always on for Mixtral)."""
    shared_expert_ffn_hidden_size: int | None = None
    """Intermediate size of the always-on shared expert; None: no shared expert."""
    shared_expert_gate: bool = False
    """Scale the shared expert's output by ``sigmoid(x @ w_gate)`` (Qwen2-MoE)."""


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
    architecture: str | None = None
    """HF ``architectures[0]`` this spec was read from (selects the name/layout map in
    `verl_mp.models.registry`); None for specs built by hand."""
    rope_type: str = "default"
    """HF rope type: ``default``, ``linear`` (positions divided by ``rope_scaling_factor``)
    or ``llama3`` (Llama-3.1 frequency-dependent scaling). A spec with
    ``rope_scaling_factor`` set and ``rope_type="default"`` means ``llama3``."""
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    """Llama-3.1 rope scaling parameters (used when rope_type is ``llama3``)."""
    sliding_window: int | None = None
    """Attend only to the last ``sliding_window`` tokens (Mistral); None: full causal."""
    value_head: bool = False
    """Critic: the output layer is a ``[1, hidden]`` value head with bias (HF
    ``*ForTokenClassification`` ``score.weight``/``score.bias``), never tied."""
    moe: MoESpec | None = None
    """Mixture-of-experts MLP in every layer; None: a dense SwiGLU MLP of ``ffn_hidden_size``."""

    @property
    def shape(self) -> ModelShape:
        return ModelShape(
            num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups,
            vocab_size=self.vocab_size,
            num_experts=self.moe.num_experts if self.moe else None,
            moe_ffn_hidden_size=self.moe.ffn_hidden_size if self.moe else None,
        )

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one KV head (GQA); 1 for plain multi-head attention."""
        return self.num_attention_heads // self.num_query_groups

    @property
    def effective_rope_type(self) -> str:
        if self.rope_type == "default" and self.rope_scaling_factor is not None:
            return "llama3"
        return self.rope_type


def padded_vocab_size(vocab_size: int, tp_size: int, multiple: int = 1) -> int:
    """Vocabulary padded so every TP rank holds an equal slice (Megatron requirement)."""
    step = tp_size * multiple
    return -(-vocab_size // step) * step
