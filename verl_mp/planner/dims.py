"""Model dimensions and parameter counts per rank: the inputs of the memory model.

Everything here is arithmetic on a model's shape (read from its HF ``config.json`` through
`verl_mp.models.spec_from_hf_config`) and a parallel layout; nothing is allocated and no
process group is needed, so the planner runs on a machine without GPUs.

Parameter layout follows the engine (`verl_mp.engine.model`): megatron GPTModel with fused
QKV (bias for Qwen2), optional per-head q/k RMSNorm (Qwen3), SwiGLU MLP, RMSNorm weights
replicated over TP, the vocabulary padded to a multiple of TP
(`verl_mp.models.spec.padded_vocab_size`), the embedding on the first pipeline stage and
the LM head on the last one (with tied embeddings and PP > 1 the last stage holds its own
copy, as megatron does), a ``[1, hidden]`` value head with bias for critics.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.models.spec import GPTSpec, padded_vocab_size


@dataclass(frozen=True, kw_only=True)
class MoEDims:
    """Routed experts of a mixture-of-experts MLP (`verl_mp.models.spec.MoESpec`).

    Expert weights are split over EP x expert-TP (`Layout.ep`, `Layout.etp`) and their
    distributed-optimizer state over the expert-data-parallel ranks; each token's activations
    pass through ``top_k`` experts. Parameter counts equal HF's (tests/unit/test_planner_calibration.py);
    the activation and dispatch terms are first-order estimates, not calibrated on a GPU.
    """

    num_experts: int
    ffn_hidden_size: int
    """Intermediate size of one expert (HF ``moe_intermediate_size``)."""
    top_k: int
    shared_ffn_hidden_size: int = 0
    """Intermediate size of the always-on shared expert (0: none)."""
    shared_gate: bool = False
    """The shared expert's output is scaled by a ``[1, hidden]`` sigmoid gate (Qwen2-MoE)."""


@dataclass(frozen=True, kw_only=True)
class MLADims:
    """Multi-latent attention (`verl_mp.models.spec.MLASpec`): the down projections and latent
    norms replicated over TP (as the engine builds them), the up projections and the output
    projection split by heads. vLLM caches the latent, ``kv_lora_rank + qk_rope_head_dim`` per
    token and layer, whole on every TP rank."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class ModelDims:
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    """Unpadded vocabulary (the engine pads it per TP layout)."""
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    value_head: bool = False
    """Critic: a ``[1, hidden]`` value head (with bias) replaces the LM head."""
    moe: MoEDims | None = None
    mla: MLADims | None = None
    """Multi-latent attention instead of GQA (``heads``/``head_dim`` then unused for parameters)."""
    first_dense_layers: int = 0
    """Leading layers with a dense ``ffn`` MLP in a mixture-of-experts model (DeepSeek-V3)."""

    @classmethod
    def from_spec(cls, spec: GPTSpec, *, value_head: bool | None = None) -> ModelDims:
        return cls(num_layers=spec.num_layers, hidden=spec.hidden_size, heads=spec.num_attention_heads,
                   kv_heads=spec.num_query_groups, head_dim=spec.head_dim, ffn=spec.ffn_hidden_size,
                   vocab=spec.vocab_size, tied=spec.tie_word_embeddings, qkv_bias=spec.add_qkv_bias,
                   qk_norm=spec.qk_layernorm,
                   value_head=spec.value_head if value_head is None else value_head,
                   moe=_moe_from_spec(spec), mla=_mla_from_spec(spec),
                   first_dense_layers=spec.moe.first_dense_layers if spec.moe is not None else 0)

    def critic(self) -> ModelDims:
        """The same backbone with a value head (what a critic built from this model holds)."""
        from dataclasses import replace

        return replace(self, value_head=True, tied=False)


def _moe_from_spec(spec: GPTSpec) -> MoEDims | None:
    """Expert dimensions of ``spec`` (None for dense models)."""
    m = spec.moe
    if m is None:
        return None
    return MoEDims(num_experts=m.num_experts, ffn_hidden_size=m.ffn_hidden_size, top_k=m.top_k,
                   shared_ffn_hidden_size=m.shared_expert_ffn_hidden_size or 0, shared_gate=m.shared_expert_gate)


def _mla_from_spec(spec: GPTSpec) -> MLADims | None:
    m = spec.mla
    if m is None:
        return None
    return MLADims(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One engine's parallel layout on its pool (DP is derived, as in the engine)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    dp: int = 1
    sp: bool = False
    ep: int = 1
    """Expert parallelism (MoE only)."""
    etp: int | None = None
    """Expert tensor parallelism (MoE only); None: TP, megatron's default."""

    @property
    def chunks(self) -> int:
        return self.pp * (self.vpp or 1)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert-data-parallel ranks (they share an expert's optimizer state)."""
        return max(1, self.tp * self.dp // (self.ep * self.expert_tp))


def attention_params(d: ModelDims, tp: int) -> int:
    """QKV (+ bias), output projection and q/k norms of one layer on one TP rank."""
    if d.mla is not None:
        return _mla_params(d, tp)
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    n = d.hidden * (q + 2 * kv) // tp + q * d.hidden // tp
    if d.qkv_bias:
        n += (q + 2 * kv) // tp
    if d.qk_norm:
        n += 2 * d.head_dim
    return n


def _mla_params(d: ModelDims, tp: int) -> int:
    m, h = d.mla, d.hidden
    q_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank:
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * d.heads * q_head // tp
    else:
        q = h * d.heads * q_head // tp
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
        + m.kv_lora_rank * d.heads * (m.qk_nope_head_dim + m.v_head_dim) // tp
    return q + kv + d.heads * m.v_head_dim * h // tp


def expert_params(d: ModelDims, ep: int = 1, etp: int = 1) -> int:
    """One layer's routed experts on one rank (split over EP x expert-TP); 0 when dense."""
    if d.moe is None:
        return 0
    return d.moe.num_experts * 3 * d.hidden * d.moe.ffn_hidden_size // (ep * etp)


def mlp_params(d: ModelDims, tp: int, ep: int = 1, etp: int | None = None) -> int:
    """SwiGLU MLP of one layer on one rank (routed experts split over EP x expert-TP, the
    shared expert over TP, router and shared-expert gate replicated)."""
    if d.moe is None:
        return 3 * d.hidden * d.ffn // tp
    m = d.moe
    shared = 3 * d.hidden * m.shared_ffn_hidden_size // tp + (d.hidden if m.shared_gate else 0)
    return expert_params(d, ep, tp if etp is None else etp) + shared + d.hidden * m.num_experts


def layer_params(d: ModelDims, tp: int, ep: int = 1, etp: int | None = None, dense: bool = False) -> int:
    """One transformer layer on one rank: attention, MLP, two RMSNorm weights; ``dense``: one
    of a MoE model's leading dense layers (`ModelDims.first_dense_layers`)."""
    mlp = 3 * d.hidden * d.ffn // tp if dense else mlp_params(d, tp, ep, etp)
    return attention_params(d, tp) + mlp + 2 * d.hidden


def stage_dense_layers(d: ModelDims, layout: Layout, stage: int) -> int:
    """How many of ``stage``'s layers are leading dense layers of a MoE model."""
    n = stage_layers(d, layout)
    return max(0, min(d.first_dense_layers, (stage + 1) * n) - stage * n) if d.moe is not None else 0


def vocab_rows(d: ModelDims, tp: int) -> int:
    """Embedding / LM-head rows on one TP rank (vocabulary padded to a TP multiple)."""
    return padded_vocab_size(d.vocab, tp) // tp


def stage_layers(d: ModelDims, layout: Layout) -> int:
    """Transformer layers on one pipeline stage (all its virtual chunks together)."""
    return d.num_layers // layout.pp


def stage_params(d: ModelDims, layout: Layout, stage: int) -> int:
    """Parameters one rank of pipeline stage ``stage`` holds."""
    first, last = stage == 0, stage == layout.pp - 1
    dense = stage_dense_layers(d, layout, stage)
    n = (stage_layers(d, layout) - dense) * layer_params(d, layout.tp, layout.ep, layout.expert_tp) \
        + dense * layer_params(d, layout.tp, dense=True)
    embedding = vocab_rows(d, layout.tp) * d.hidden
    if first:
        n += embedding
    if last:
        n += d.hidden  # final norm
        if d.value_head:
            n += d.hidden + 1
        elif not d.tied or not first:  # untied head, or the last stage's copy of a tied one
            n += embedding
    return n


def stage_expert_params(d: ModelDims, layout: Layout, stage: int = 0) -> int:
    """The routed-expert part of `stage_params` (its optimizer state is sharded over expert-DP)."""
    moe_layers = stage_layers(d, layout) - stage_dense_layers(d, layout, stage)
    return moe_layers * expert_params(d, layout.ep, layout.expert_tp)


def total_params(d: ModelDims) -> int:
    """The whole model at TP = PP = 1 (the unpadded count HF reports)."""
    return stage_params(d, Layout(), 0)


def largest_tensor_params(d: ModelDims, tp: int, gathered: bool) -> int:
    """Elements of the largest single tensor a weight sync moves (TP-gathered or a shard)."""
    rows = d.vocab if gathered else vocab_rows(d, tp)
    split = 1 if gathered else tp
    fc1 = 2 * d.ffn * d.hidden // split if d.moe is None else 2 * d.moe.ffn_hidden_size * d.hidden
    return max(rows * d.hidden, fc1)
