"""Per-GPU bytes of one Megatron engine: weights, gradients, optimizer state, activations.

Pure arithmetic (no torch, no process groups). Units are bytes; "per token" means per
token of a micro-batch on one TP rank. ``p`` is the model dtype's size (2 for bf16).

Static state (`engine_state_bytes`), as the engine builds it (`verl_mp.engine.model`,
`verl_mp.engine.optimizer`):
- weights: ``p`` per parameter on this rank;
- gradients: 4 per parameter (megatron DDP with ``grad_reduce_in_fp32=True``: one fp32
  grad buffer for every trainable parameter);
- optimizer: Adam's two fp32 moments (8) plus an fp32 main copy of bf16/fp16 weights (4),
  divided by DP with the distributed optimizer (``optim.use_distributed_optimizer``).

Activations (`layer_activation_bytes`): what one transformer layer saves for backward,
counted tensor by tensor for the layer spec the engine uses without transformer-engine
(``attention_backend=sdpa``: megatron's local linears, `SDPAttention`, the project's fp32
`RMSNorm`, SwiGLU, no dropout). Per token and layer, with ``h`` hidden, ``a``/``g`` query/KV
heads of size ``d`` and ``f`` the FFN size::

    2 x (4h + 4 + p h)     two RMSNorms: fp32 copy of the input, 1/rms, normalised value
    2 x p h                inputs of linear_qkv and linear_fc1 (the norm outputs)
    p (a + 2g) d / t       fused QKV output (the V view that attention saves keeps it alive)
    p a d / t + p g d / t  Q and K after RoPE (saved by attention)
    p a d / t + 4a / t     attention output (= linear_proj's input) and its fp32 log-sum-exp
    4 p f / t              SwiGLU: fc1 output (2f), silu(gate) (f), product (f: fc2's input)
    (4 + p)(a + g) d / t   q/k RMSNorm (Qwen3 only), + 4 (a + g) / t for its 1/rms

The GPU kernel path (``fused``: `verl_mp.kernels.layers`, what ``VERL_MP_KERNELS`` / CUDA
selects) saves less: each RMSNorm keeps its input (``p`` per element instead of ``4 + p``)
and SwiGLU only the fc1 output (``3 p f / t`` with fc2's input).

plus 4 p d per sequence position (RoPE cos/sin). ``t`` is the TP size; with sequence
parallelism the first two lines are divided by ``t`` as well. Every term was checked by
counting the storages that autograd saves in one forward of the real megatron layer
(`tests/unit/test_planner_activations.py`, exact to the byte). For reference, Korthikanti
et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Table 2;
megatron's ``theoretical_memory_usage.py``) give ``sbh (34 + 5 a s / h)`` for a GELU MLP of
``4h`` with dropout and unfused attention: flash-style attention drops the ``a s / h``
term, no dropout drops its masks, and SwiGLU with ``f != 4h``, GQA and the fp32 norm
copies change the rest, hence the enumeration above.
With transformer-engine installed, ``attention_backend=auto`` picks TE's layer spec, whose
fused norm+linear layers save less than the fp32 norm copies above: the plan is then an
upper bound (not measured).

Recompute (``actor.recompute``, per role):
- ``selective`` with ``recompute_modules``: ``mlp`` drops the SwiGLU term (its input is
  the fc1 input, saved anyway); ``core_attn`` drops only the log-sum-exp (SDPA saves no
  ``[s, s]`` scores, so this saves almost nothing with this layer spec);
- ``full`` (every layer, uniform, one layer per unit): a layer keeps only its input
  ``p h`` (``/t`` with SP); backward re-runs one layer at a time, so one layer's full
  set comes back transiently.

LM head (`logits_bytes_per_token`, last stage): the fused Triton log-prob kernel keeps the
``p``-byte logits and writes their ``p``-byte gradient (2 p V per token in training); the
torch path (`verl_mp.engine.logprobs._log_probs_torch`) holds, at its forward peak, the
logits, an fp32 copy (unless the logits are fp32), the shifted logits, exp and the masked
exp: ``p V + 4 V + 12 V`` (+4 V for the entropy). ``V`` is this TP rank's vocabulary slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.planner.dims import Layout, ModelDims, stage_expert_params, stage_params, vocab_rows

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_BYTES = 4
"""megatron DDP grad buffers are fp32 (`verl_mp.engine.model.wrap_ddp`: grad_reduce_in_fp32)."""
ADAM_BYTES = 8
MAIN_PARAM_BYTES = 4
RECOMPUTE_GRANULARITIES = (None, "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "mlp")
LOGPROB_IMPLS = ("fused", "torch")


@dataclass(frozen=True, kw_only=True)
class Recompute:
    granularity: str | None = None
    modules: tuple[str, ...] = ()

    @classmethod
    def of(cls, section) -> Recompute:
        """From a role's engine settings (``actor``, ``ref``, ``critic``: `EngineConfig`)."""
        gran = None if section.recompute == "none" else section.recompute
        mods = tuple(section.recompute_modules) if gran == "selective" else ()
        return cls(granularity=gran, modules=mods)


@dataclass(frozen=True)
class StateBytes:
    """Static per-rank state of one engine."""

    weights: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer


def engine_state_bytes(d: ModelDims, layout: Layout, stage: int, dtype: str, *, trainable: bool,
                       distributed_optimizer: bool = True) -> StateBytes:
    """Weights, fp32 grads and Adam state of one rank of pipeline stage ``stage``."""
    params = stage_params(d, layout, stage)
    p = DTYPE_BYTES[dtype]
    if not trainable:
        return StateBytes(params * p, 0, 0)
    per_param = ADAM_BYTES + (MAIN_PARAM_BYTES if p < 4 else 0)
    return StateBytes(params * p, params * GRAD_BYTES, per_param * sharded_params(d, layout, stage, distributed_optimizer))


def sharded_params(d: ModelDims, layout: Layout, stage: int, distributed_optimizer: bool) -> int:
    """Parameters whose optimizer state this rank holds: dense ones over DP, routed experts
    over expert-DP (megatron's chained optimizer), everything without a distributed optimizer."""
    params = stage_params(d, layout, stage)
    if not distributed_optimizer:
        return params
    experts = stage_expert_params(d, layout, stage)
    return (params - experts) // layout.dp + experts // layout.edp


def layer_terms(d: ModelDims, p: int, tp: int, sp: bool, fused: bool = False) -> dict[str, float]:
    """Bytes per token one layer saves for backward, by tensor group (see the module doc);
    ``fused``: the GPU kernel path (fused RMSNorm and SwiGLU)."""
    h, a, g, hd = d.hidden, d.heads, d.kv_heads, d.head_dim
    rep = tp if sp else 1
    terms = {
        "norms": 2 * (_norm_bytes(p, fused) * h + 4) / rep,
        "linear_inputs": 2 * p * h / rep,
        "qkv": p * (a + 2 * g) * hd / tp,
        "rope_qk": p * (a + g) * hd / tp,
        "attn_out": p * a * hd / tp,
        "lse": 4 * a / tp,
        "mlp": _mlp_term(d, p, tp, fused),
    }
    if d.mla is not None:  # first order: the latents, the up-projected q/k/v, the rotated parts
        m = d.mla
        q_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        latents = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        terms["qkv"] = p * latents + p * a * (q_head + q_head + m.v_head_dim) / tp
        terms["rope_qk"] = p * (a + 1) * m.qk_rope_head_dim / tp
        terms["attn_out"] = p * a * m.v_head_dim / tp
    if d.qk_norm:
        terms["qk_norm"] = (_norm_bytes(p, fused) * (a + g) * hd + 4 * (a + g)) / tp
    return terms


def _norm_bytes(p: int, fused: bool) -> int:
    """Per normalised element an RMSNorm saves (plus 4 per row for 1/rms): the fused op its
    input; the torch path an fp32 copy and the normalised value."""
    return p if fused else 4 + p


def _mlp_term(d: ModelDims, p: int, tp: int, fused: bool = False) -> float:
    if d.moe is None:
        return (3 if fused else 4) * p * d.ffn / tp
    # Uncalibrated first-order MoE term: each token through top_k experts (+ shared
    # expert) and fp32 router scores; dispatch buffers are not counted yet. A shared expert
    # saves what a dense SwiGLU MLP saves; a routed one also keeps its activation output,
    # which megatron scales by the router probability (``per_token_scale``) before fc2.
    m, dense_f = d.moe, 3 if fused else 4
    routed, shared = (dense_f + 1) * p * m.ffn_hidden_size, dense_f * p * m.shared_ffn_hidden_size
    return (m.top_k * routed + shared) / tp + 4 * m.num_experts


def layer_activation_bytes(d: ModelDims, p: int, tp: int, sp: bool, recompute: Recompute,
                           fused: bool = False) -> float:
    """Bytes per token one layer keeps between its forward and its backward."""
    if recompute.granularity == "full":
        return p * d.hidden / (tp if sp else 1)
    terms = layer_terms(d, p, tp, sp, fused)
    if recompute.granularity == "selective":
        if "mlp" in recompute.modules:
            terms.pop("mlp")
        if "core_attn" in recompute.modules:
            terms.pop("lse")
    return sum(terms.values())


def layer_bytes_per_micro_batch(d: ModelDims, p: int, tp: int, sp: bool, recompute: Recompute,
                                rows: float, seq: int, fused: bool = False) -> float:
    """What one layer saves for a micro-batch of ``rows`` x ``seq`` tokens (RoPE's cos/sin
    included, except under full recompute, where the layer keeps only its input)."""
    saved = layer_activation_bytes(d, p, tp, sp, recompute, fused) * rows * seq
    if recompute.granularity != "full":
        saved += rope_bytes_per_position(d, p) * seq
    return saved


def full_layer_bytes(d: ModelDims, p: int, tp: int, sp: bool, fused: bool = False) -> float:
    """Bytes per token of one layer without recompute (also the forward-only transient)."""
    return sum(layer_terms(d, p, tp, sp, fused).values())


def rope_bytes_per_position(d: ModelDims, p: int) -> int:
    """RoPE cos/sin tensors ``[s, 1, 1, d]`` saved per layer (independent of the rows)."""
    return 4 * p * d.head_dim


def final_norm_bytes_per_token(d: ModelDims, p: int, tp: int, sp: bool, fused: bool = False) -> float:
    """Final RMSNorm saved tensors plus the LM head's input."""
    return (_norm_bytes(p, fused) * d.hidden + 4 + p * d.hidden) / (tp if sp else 1)


def logits_bytes_per_token(d: ModelDims, p: int, tp: int, *, impl: str, train: bool,
                           entropy: bool = False) -> float:
    """Peak bytes per token of the LM head + log-prob op (see the module doc)."""
    if d.value_head:
        return 4.0  # [tokens, 1] values
    v = vocab_rows(d, tp)
    if impl == "fused":
        return (2 if train else 1) * p * v
    if impl != "torch":
        raise ValueError(f"log-prob impl {impl!r} is not one of {LOGPROB_IMPLS}")
    upcast = 4 * v if p < 4 else 0
    return p * v + upcast + 12 * v + (4 * v if entropy else 0)


def lm_head_grad_bytes(d: ModelDims, p: int, tp: int) -> int:
    """The LM head's weight gradient, materialised in the model dtype before it is added
    to the fp32 grad buffer (no gradient-accumulation fusion without apex/TE); it is live
    together with the logits and their gradient."""
    return 0 if d.value_head else p * vocab_rows(d, tp) * d.hidden


def pipeline_io_bytes_per_token(d: ModelDims, p: int, layout: Layout) -> float:
    """A stage's received input and sent output, kept per in-flight micro-batch (PP > 1)."""
    if layout.pp == 1:
        return 0.0
    return 2 * p * d.hidden / (layout.tp if layout.sp else 1)


def in_flight_micro_batches(layout: Layout, stage: int, num_micro_batches: int) -> float:
    """Micro-batches whose activations a stage holds at once under 1F1B (megatron's
    schedule): ``pp - stage`` (capped by the count), times the interleaving penalty
    ``1 + (pp - 1) / (pp * vpp)`` with virtual stages (megatron's estimate)."""
    n = min(layout.pp - stage, num_micro_batches)
    if layout.vpp:
        n *= 1 + (layout.pp - 1) / (layout.pp * layout.vpp)
    return n


def adam_step_transient_bytes(d: ModelDims, layout: Layout, stage: int, distributed_optimizer: bool) -> int:
    """torch AdamW (megatron's fallback without apex/TE) with foreach kernels allocates one
    fp32 temporary per main parameter for ``sqrt(v)`` during the step."""
    return 4 * sharded_params(d, layout, stage, distributed_optimizer)
