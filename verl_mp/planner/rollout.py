"""Per-GPU bytes of the colocated vLLM engine and of the weight sync.

vLLM (GPU) takes ``gpu_memory_utilization x total GPU memory`` when it starts and while it
is awake: its weights (this rank's rollout-TP shard), a workspace for its largest forward
pass and sampler, and the KV cache, which gets whatever is left of that budget. It refuses
to start when less than that budget is free, or when the KV cache cannot hold one
``max_model_len`` sequence. Asleep (``rollout.sleep_level``, between generations) it keeps
only a small residual (CUDA-graph pools, its allocator's bookkeeping); for a sync it wakes
its weights only. With ``rollout.keep_weights_on_gpu`` the weights stay through training
and only the KV cache is released.

The sync (`verl_mp.bridge.weight_sync`) holds, beyond the rank's own shards, one bucket
of ``rollout.weight_sync_bucket_mb`` plus, in ``gather`` mode, one TP-gathered tensor;
nothing where it copies in place (``local`` mode, one pipeline stage, the vocabulary split
alike: `sync_copies_in_place`).

A rollout on a pool of its own gets the weights over a channel
(`verl_mp.bridge.transport`): the actor's rank 0 holds two send buffers (one bucket on the
wire while the next fills); each rollout rank receives into a fresh buffer per bucket (the
next one posted while vLLM loads this one) and vLLM's layer-wise reload keeps the pieces of
a module until its last piece arrives, then builds the module's shard anew before copying
it in place (`channel_receive_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.planner.dims import (
    Layout,
    ModelDims,
    largest_tensor_params,
    stage_expert_params,
    total_params,
    vocab_rows,
)

GIB = 2**30
VLLM_ASLEEP_BYTES = 1 * GIB
"""Residual of a sleeping vLLM engine. Estimate: the colocated GPU test measured 1.4 GiB in
use after ``sleep(level=1)`` for the whole process (CUDA context and tiny Megatron models
included; `benchmarks/RESULTS.md`, "Colocated hand-over")."""
VLLM_FIXED_WORKSPACE_BYTES = 1 * GIB
"""CUDA graphs and torch.compile buffers inside vLLM's budget. Estimate, fitted so that the
workspace of issue 21's run (Qwen2-1.5B body, tiny vocabulary, u=0.4 of 140.4 GiB: 52.3 GiB
of KV cache) comes out at the measured ~1.5 GiB."""
VLLM_MAX_BATCHED_TOKENS = 8192
VLLM_MAX_SEQS = 256
"""The prefill chunk and the sampler batch in `vllm_workspace_bytes`' estimate. Not vLLM 0.26's
defaults on GPUs of 70 GiB or more (16384 tokens, 1024 sequences: `verl_mp.planner.choose`'s
`VLLM_DECODE_SEQS`): with these values the estimate met the measured workspace of issue 21's
run and the planner's H200 calibration (`tests/unit/test_planner_calibration.py`), where vLLM's
own values would over-count by ~0.5 GiB (why vLLM's profile peaks lower was not examined).
Re-fit them against a measurement; do not just raise them to vLLM's values."""


@dataclass(frozen=True, kw_only=True)
class RolloutMemory:
    budget: int
    """gpu_memory_utilization x GPU memory: what vLLM holds while awake."""
    weights: int
    workspace: int
    kv_cache: int
    kv_bytes_per_token: int
    asleep: int = VLLM_ASLEEP_BYTES
    sleeps: bool = True
    """False for the HF backend: its weights stay on the GPU in every phase."""
    keeps_weights: bool = False
    """``rollout.keep_weights_on_gpu``: asleep it releases only the KV cache (``asleep``
    includes the weights) and the sync has nothing to wake."""

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_cache) // self.kv_bytes_per_token


def rollout_memory(d: ModelDims, tp: int, p: int, utilization: float, gpu_bytes: int,
                   world: int | None = None, keep_weights: bool = False) -> RolloutMemory:
    """``world``: ranks of the rollout (mixture of experts: vLLM splits the routed experts over
    all of them, rollout TP x DP, whole experts with expert parallelism or each expert sliced
    without; the rest over TP). ``keep_weights``: ``rollout.keep_weights_on_gpu``."""
    budget = int(utilization * gpu_bytes)
    experts = stage_expert_params(d, Layout())
    weights = (total_params(d) - experts) * p // tp + experts * p // (world or tp)
    workspace = vllm_workspace_bytes(d, tp, p)
    return RolloutMemory(budget=budget, weights=weights, workspace=workspace,
                         kv_cache=budget - weights - workspace, kv_bytes_per_token=kv_bytes_per_token(d, tp, p),
                         asleep=VLLM_ASLEEP_BYTES + (weights if keep_weights else 0), keeps_weights=keep_weights)


def hf_rollout_memory(d: ModelDims, p: int) -> RolloutMemory:
    """The HF fallback backend (``rollout.backend=hf``): the whole model on every rank,
    never asleep; it decodes one sequence at a time, so its KV cache is one row's."""
    weights = total_params(d) * p
    return RolloutMemory(budget=weights, weights=weights, workspace=0, kv_cache=0,
                         kv_bytes_per_token=kv_bytes_per_token(d, 1, p), asleep=weights, sleeps=False)


def kv_bytes_per_token(d: ModelDims, tp: int, p: int) -> int:
    """K and V of every layer for one token on one rollout rank (KV heads are split over
    TP, and replicated when TP exceeds their number)."""
    if d.mla is not None:  # vLLM's MLA caches the latent and the rotary key, whole on every TP rank
        return d.num_layers * (d.mla.kv_lora_rank + d.mla.qk_rope_head_dim) * p
    kv_heads = max(1, d.kv_heads // tp)
    return 2 * d.num_layers * kv_heads * d.head_dim * p


def vllm_workspace_bytes(d: ModelDims, tp: int, p: int) -> int:
    """vLLM's profiled peak besides weights and KV cache: the largest chunked-prefill
    forward (hidden states and SwiGLU intermediates of its token budget), the sampler's fp32
    logits for its maximum batch, and CUDA graphs (`VLLM_FIXED_WORKSPACE_BYTES`)."""
    ffn = d.ffn if d.moe is None else d.moe.ffn_hidden_size * d.moe.top_k
    forward = VLLM_MAX_BATCHED_TOKENS * p * (4 * d.hidden + 3 * ffn // tp)
    sampler = VLLM_MAX_SEQS * vocab_rows(d, tp) * 4 * 2
    return VLLM_FIXED_WORKSPACE_BYTES + forward + sampler


def sync_mode(requested: str, train_tp: int, rollout_tp: int) -> str:
    """What ``auto`` resolves to on CUDA vLLM (`verl_mp.bridge.weight_sync.make_weight_sync`)."""
    if requested != "auto":
        return requested
    return "local" if train_tp == rollout_tp else "gather"


def sync_copies_in_place(d: ModelDims, layout: Layout, mode: str) -> bool:
    """`verl_mp.bridge.weight_sync.WeightSync.copies_directly` on a CUDA vLLM: ``local`` mode,
    one pipeline stage, and vLLM's vocabulary rows per rank equal Megatron's (nothing gathered):
    every shard is copied straight into its vLLM parameter, no bucket between. Experts count
    only at one rank (EP 1, TP 1); other expert splits may fall back to ``gather`` at run time
    (`make_weight_sync`), so the plan keeps their bucket."""
    # lazy: `verl-mp --help` imports the planner (to build its parser) but not the weight sync's layouts
    from verl_mp.bridge.vllm_layout import vllm_vocab_rows_per_rank

    if mode != "local" or layout.pp != 1 or (d.moe is not None and (layout.tp, layout.ep) != (1, 1)):
        return False
    try:
        return layout.tp == 1 or vocab_rows(d, layout.tp) == vllm_vocab_rows_per_rank(d.vocab, layout.tp)
    except ValueError:  # vLLM cannot split this vocabulary at all (preflight says so)
        return False


def sync_transient_bytes(d: ModelDims, layout: Layout, mode: str, bucket_mb: int, p: int) -> int:
    """The sync's own allocations beyond the shards: none when it copies in place, else one
    bucket (or the largest tensor, which gets its own), plus the TP-gathered tensor in
    ``gather`` mode."""
    if sync_copies_in_place(d, layout, mode):
        return 0
    train_tp = layout.tp
    bucket = bucket_mb * 2**20
    if mode == "local":
        return max(bucket, largest_tensor_params(d, train_tp, gathered=False) * p)
    gathered = largest_tensor_params(d, train_tp, gathered=True) * p
    return max(bucket, gathered) + gathered


def channel_bucket_bytes(d: ModelDims, bucket_mb: int, p: int) -> int:
    """One bucket of the weight channel: ``bucket_mb``, or the largest HF tensor, which gets
    a bucket of its own when larger (`verl_mp.utils.buckets.pack_buckets`)."""
    return max(bucket_mb * 2**20, largest_hf_tensor_params(d) * p)


def channel_send_bytes(d: ModelDims, bucket_mb: int, p: int) -> int:
    """Send buffers on the actor's rank 0 (`transport.send`): the bucket being filled and the
    one on the wire."""
    return 2 * channel_bucket_bytes(d, bucket_mb, p)


def channel_receive_bytes(d: ModelDims, tp: int, bucket_mb: int, p: int) -> int:
    """Receive-side transient on one rollout rank (`transport.receive` + vLLM 0.32's
    layer-wise reload): the bucket being loaded, the next one posted, the previous one while
    it holds the first pieces of a module split over the boundary (gate/up, q/k/v: their
    pieces are consecutive, so one earlier bucket at most), and the module's shard that vLLM
    materializes when the module is complete."""
    return 3 * channel_bucket_bytes(d, bucket_mb, p) + largest_module_shard_params(d, tp) * p


def largest_hf_tensor_params(d: ModelDims) -> int:
    """Elements of the largest tensor in HF layout (embedding / LM head, q_proj, gate_proj);
    routed experts travel per expert (a mixture of experts is refused on a split rollout)."""
    ffn = d.ffn if d.moe is None else max(d.moe.ffn_hidden_size, d.moe.shared_ffn_hidden_size)
    return max(d.vocab * d.hidden, d.heads * d.head_dim * d.hidden, ffn * d.hidden)


def largest_module_shard_params(d: ModelDims, tp: int) -> int:
    """Elements of vLLM's largest module on one rollout-TP rank: the embedding / LM head
    rows, the fused QKV or the fused gate/up projection."""
    ffn = d.ffn if d.moe is None else max(d.moe.ffn_hidden_size, d.moe.shared_ffn_hidden_size)
    qkv = (d.heads + 2 * d.kv_heads) * d.head_dim * d.hidden // tp
    return max(vocab_rows(d, tp) * d.hidden, qkv, 2 * ffn * d.hidden // tp)
