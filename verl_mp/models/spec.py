"""An architecture-neutral description of a decoder-only transformer.

Each supported HF architecture converts its config into a `GPTSpec` (see
`verl_mp/models/`), and the engine builds a megatron GPTModel from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.config.parallel import ModelShape


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The mixture-of-experts MLP of the decoder layers (Qwen2/3-MoE, Mixtral, DeepSeek-V3).

    Softmax routing (Qwen, Mixtral): ``p = softmax(router(x))`` over all experts in fp32, the
    ``top_k`` largest are chosen, optionally renormalised to sum to 1 (``norm_topk_prob``),
    and the chosen experts' SwiGLU outputs are summed with weights ``p``. A shared expert
    (Qwen2-MoE) runs on every token and is scaled by ``sigmoid(shared_expert_gate(x))``.

    Sigmoid routing (DeepSeek-V3): ``s = sigmoid(router(x))`` in fp32; experts are chosen by
    ``s + expert_bias`` (only among the ``group_topk`` best of ``num_groups`` expert groups,
    a group scored by the sum of its two best biased scores), weighted by their unbiased
    ``s`` renormalised to sum to 1, times ``scaling_factor``. Shared experts are unscaled.
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
    score_function: str = "softmax"
    """``softmax`` (Qwen, Mixtral) or ``sigmoid`` (DeepSeek-V3)."""
    expert_bias: bool = False
    """Sigmoid routing chooses by ``score + bias`` (HF ``e_score_correction_bias``, megatron's
    ``expert_bias`` buffer); the weights use the unbiased scores."""
    scaling_factor: float | None = None
    """Multiplies the routing weights (HF ``routed_scaling_factor``); None: 1."""
    num_groups: int | None = None
    """Group-limited routing: experts form this many equal groups (HF ``n_group``); None: off."""
    group_topk: int | None = None
    """Groups a token may use (HF ``topk_group``)."""
    first_dense_layers: int = 0
    """The first layers have a dense SwiGLU MLP of ``GPTSpec.ffn_hidden_size`` instead
    (HF ``first_k_dense_replace``); the rest are MoE layers."""

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (0-based) has the MoE MLP."""
        return layer >= self.first_dense_layers


@dataclass(frozen=True, kw_only=True)
class YarnSpec:
    """YaRN rope scaling as DeepSeek-V2/V3 use it (HF ``rope_scaling`` ``type: yarn``).

    Inverse frequencies blend ``1 / base^(2i/d)`` (kept for fast-rotating dimensions, above
    ``beta_fast`` rotations over ``original_max_position_embeddings``) and the same divided by
    ``factor`` (below ``beta_slow`` rotations), linearly in between (the correction range
    rounded outwards to whole dimensions). cos/sin are multiplied by
    ``m(factor, mscale) / m(factor, mscale_all_dim)`` and the softmax scale by
    ``m(factor, mscale_all_dim)^2``, with ``m(s, a) = 0.1 a ln s + 1`` (1 for ``s <= 1``).
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """Multi-latent attention (DeepSeek-V2/V3), per layer.

    Queries: ``q = W_q x`` or, with ``q_lora_rank``, ``q = W_qb norm(W_qa x)``; each head's
    query is ``[nope (qk_nope_head_dim); rope (qk_rope_head_dim)]``. Keys and values come
    from one latent: ``[c; k_rope] = W_kva x`` (``kv_lora_rank + qk_rope_head_dim``), each
    head's ``[k_nope; v] = W_kvb norm(c)``, and the single ``k_rope`` (rotated) is shared by
    all heads. RoPE rotates interleaved pairs (HF ``rope_interleave=True``).
    """

    q_lora_rank: int | None
    """None: queries come from one full projection (HF ``q_proj``)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    yarn: YarnSpec | None = None
    """YaRN rope scaling of the rotary part (DeepSeek-V3's ``rope_scaling``); None: plain RoPE."""

    @property
    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    """Mixture-of-experts MLP (in every layer but the first ``moe.first_dense_layers``); None:
    a dense SwiGLU MLP of ``ffn_hidden_size`` everywhere."""
    mla: MLASpec | None = None
    """Multi-latent attention (DeepSeek-V3) instead of (GQA) self-attention; ``kv_channels``
    is then the rotary dimension ``mla.qk_rope_head_dim``."""

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
