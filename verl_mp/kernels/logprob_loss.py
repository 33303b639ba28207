"""Per-token log-probs (+ entropy) from vocab-sharded logits, with a fused backward.

`vocab_parallel_log_probs` is a differentiable op: logits `[..., V_local]` (this TP
rank's vocabulary shard) and labels `[...]` -> log_probs `[...]` fp32 and optionally
entropy `[...]` fp32. Any loss built from them in torch (PPO-clip from
`verl_mp.algo.POLICY_LOSSES`, an entropy bonus, a KL term) is a handful of `[tokens]`
ops; autograd hands its per-token gradients (a = dL/dlogp, b = dL/dH) to one backward
pass over the logits that writes dL/dlogits in the logits dtype. So the whole loss costs
two reads of the logits and one write of their gradient, and no fp32
`[tokens, vocab]` tensor is ever allocated.

Tensor parallelism: each rank streams its shard to per-token partial statistics
(row max, sum of exp, entropy accumulator, target logit); ranks combine them with one
all-reduce MAX of one value per token and one all-reduce SUM of two (three with
entropy). `combine_partial_stats` is the same math on stacked shards, without
torch.distributed. The backward needs no communication.

Padded vocabulary and temperature: Megatron pads the vocabulary to a multiple of the TP
size; with `vocab_size` (the real, unpadded size) the ids >= vocab_size are left out of
the max, the sum of exp and the entropy, and their logits get exactly zero gradient.
With `temperature` T the distribution is softmax(logits / T) and the gradient carries
the 1/T factor.

Implementations: Triton kernels (`_logprob_triton.py`) or a chunked torch reference,
chosen by `impl` / ``VERL_MP_KERNELS`` (see `dispatch.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from verl_mp.kernels.dispatch import FLOAT_DTYPES, check_tensor, count_launch, select_impl

NEG_BIG = -1.0e30
Reduce = Callable[[torch.Tensor], torch.Tensor]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits / temperature (no op at T = 1)."""
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def _partial_stats_torch(
    logits, labels, vocab_start, compute_entropy, chunk_tokens, *, vocab_valid=None, temperature=1.0
):
    """Per-row (max, sum_exp, ent_acc, target) of a vocab shard `[N, V]` -> 4 x `[N]` fp32.

    Only the first `vocab_valid` columns (default all) are vocabulary; the rest is padding.
    """
    n, vocab_local = logits.shape
    vocab_valid = vocab_local if vocab_valid is None else vocab_valid
    row_max, sum_exp, ent_acc, target = (torch.zeros(n, device=logits.device) for _ in range(4))
    if vocab_valid == 0:  # a shard of padding only: contributes nothing
        return row_max.fill_(NEG_BIG), sum_exp, ent_acc, target
    local = labels - vocab_start
    in_shard = (local >= 0) & (local < vocab_valid)
    for i in range(0, n, chunk_tokens):
        z = _scaled(logits[i : i + chunk_tokens, :vocab_valid], temperature)
        m = z.max(-1).values.clamp(min=NEG_BIG)
        e = torch.exp(z - m[:, None])
        row_max[i : i + chunk_tokens] = m
        sum_exp[i : i + chunk_tokens] = e.sum(-1)
        if compute_entropy:
            ent_acc[i : i + chunk_tokens] = torch.where(e > 0, e * (z - m[:, None]), 0.0).sum(-1)
        idx = local[i : i + chunk_tokens].clamp(0, vocab_valid - 1)[:, None]
        tgt = z.gather(-1, idx).squeeze(-1)
        target[i : i + chunk_tokens] = torch.where(in_shard[i : i + chunk_tokens], tgt, 0.0)
    return row_max, sum_exp, ent_acc, target


def _partial_stats_triton(
    logits,
    labels,
    vocab_start,
    compute_entropy,
    block_v=None,
    num_warps=None,
    *,
    vocab_valid=None,
    temperature=1.0,
):
    from verl_mp.kernels._logprob_triton import logprob_fwd_kernel  # lazy: reads TRITON_INTERPRET

    n, vocab_local = logits.shape
    row_max, sum_exp, ent_acc, target = (
        torch.empty(n, device=logits.device, dtype=torch.float32) for _ in range(4)
    )
    default_block, default_warps = _block_v(vocab_local)
    block_v, num_warps = block_v or default_block, num_warps or default_warps
    count_launch("logprob_fwd")
    logprob_fwd_kernel[(n,)](
        logits,
        labels,
        row_max,
        sum_exp,
        ent_acc,
        target,
        logits.stride(0),
        vocab_local if vocab_valid is None else vocab_valid,
        vocab_start,
        1.0 / temperature,
        COMPUTE_ENTROPY=compute_entropy,
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return row_max, sum_exp, ent_acc, target


def _block_v(vocab_local: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps): chunks of up to 4096 on 4 warps, 32 elements per thread.

    On an H200 (bf16, V=151936) this streamed at 3.9 TB/s, as fast as any of
    2048-16384 x 4-16 warps (benchmarks/RESULTS.md).
    """
    return 1 << max(4, min(12, (vocab_local - 1).bit_length())), 4


def _combine(row_max, sum_exp, ent_acc, target, reduce_max: Reduce, reduce_sum: Reduce):
    """Global (lse, target logit, entropy or None) per token from per-shard statistics.

    One MAX reduction of the row max, then one SUM of [sum_exp, target] (+ the entropy
    accumulator), each rescaled to the global max.
    """
    global_max = reduce_max(row_max)
    scale = torch.exp(row_max - global_max)
    parts = [sum_exp * scale, target]
    if ent_acc is not None:
        parts.append(scale * (ent_acc + (row_max - global_max) * sum_exp))
    total = reduce_sum(torch.stack(parts))
    log_sum = torch.log(total[0])
    entropy = log_sum - total[2] / total[0] if ent_acc is not None else None
    return global_max + log_sum, total[1], entropy


def combine_partial_stats(
    row_max: torch.Tensor,
    sum_exp: torch.Tensor,
    ent_acc: torch.Tensor | None,
    target: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Combine per-shard statistics stacked as `[num_shards, N]` -> (lse, target, entropy).

    The math of the TP all-reduces, for tests and for callers that gather shards
    themselves. Outputs are `[N]`; entropy is None when `ent_acc` is None.
    """
    return _combine(
        row_max, sum_exp, ent_acc, target, lambda x: x.max(0).values, lambda x: x.sum(1)
    )


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _dist_reducers(tp_group) -> tuple[Reduce, Reduce]:
    import torch.distributed as dist

    def reduce_max(x):
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=tp_group)
        return x

    def reduce_sum(x):
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=tp_group)
        return x

    return reduce_max, reduce_sum


def _backward_torch(
    logits,
    labels,
    vocab_start,
    lse,
    entropy,
    a,
    b,
    chunk_tokens,
    *,
    vocab_valid=None,
    temperature=1.0,
):
    """dL/dlogits `[N, V]` in the logits dtype, chunk by chunk (0 on padded columns)."""
    n, vocab_local = logits.shape
    vocab_valid = vocab_local if vocab_valid is None else vocab_valid
    grad = torch.empty_like(logits)
    grad[:, vocab_valid:] = 0
    if vocab_valid == 0:
        return grad
    local = labels - vocab_start
    in_shard = (local >= 0) & (local < vocab_valid)
    for i in range(0, n, chunk_tokens):
        sl = slice(i, i + chunk_tokens)
        log_p = _scaled(logits[sl, :vocab_valid], temperature) - lse[sl, None]
        p = torch.exp(log_p)
        g = -a[sl, None] * p
        if b is not None:
            g -= b[sl, None] * torch.where(p > 0, p * (log_p + entropy[sl, None]), 0.0)
        hit = torch.where(in_shard[sl], a[sl], 0.0)[:, None]
        g.scatter_add_(-1, local[sl].clamp(0, vocab_valid - 1)[:, None], hit)
        if temperature != 1.0:
            g /= temperature
        grad[sl, :vocab_valid] = g.to(logits.dtype)
    return grad


def _backward_triton(
    logits,
    labels,
    vocab_start,
    lse,
    entropy,
    a,
    b,
    block_v=None,
    num_warps=None,
    *,
    vocab_valid=None,
    temperature=1.0,
):
    from verl_mp.kernels._logprob_triton import logprob_bwd_kernel  # lazy: reads TRITON_INTERPRET

    n, vocab_local = logits.shape
    grad = torch.empty_like(logits)
    default_block, default_warps = _block_v(vocab_local)
    block_v, num_warps = block_v or default_block, num_warps or default_warps
    count_launch("logprob_bwd")
    logprob_bwd_kernel[(n,)](
        logits,
        grad,
        labels,
        lse,
        entropy,
        a.contiguous(),
        a if b is None else b.contiguous(),
        logits.stride(0),
        grad.stride(0),
        vocab_local,
        vocab_local if vocab_valid is None else vocab_valid,
        vocab_start,
        1.0 / temperature,
        HAS_ENTROPY_GRAD=b is not None,
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return grad


class _VocabParallelLogProb(torch.autograd.Function):
    """logits `[N, V_local]`, labels `[N]` -> log_probs `[N]` (+ entropy `[N]`)."""

    @staticmethod
    def forward(ctx, logits, labels, shard, compute_entropy, tp_group, impl, chunk_tokens):
        vocab_start, vocab_valid, temperature = shard
        opts = dict(vocab_valid=vocab_valid, temperature=temperature)
        if impl == "triton":
            stats = _partial_stats_triton(logits, labels, vocab_start, compute_entropy, **opts)
        else:
            stats = _partial_stats_torch(
                logits, labels, vocab_start, compute_entropy, chunk_tokens, **opts
            )
        row_max, sum_exp, ent_acc, target = stats
        ent_acc = ent_acc if compute_entropy else None
        reducers = (_identity, _identity) if tp_group is None else _dist_reducers(tp_group)
        lse, target, entropy = _combine(row_max, sum_exp, ent_acc, target, *reducers)
        ctx.save_for_backward(logits, labels, lse, entropy if compute_entropy else lse)
        ctx.config = (shard, impl, chunk_tokens)
        ctx.set_materialize_grads(False)
        log_probs = target - lse
        return (log_probs, entropy) if compute_entropy else log_probs

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy=None):
        logits, labels, lse, entropy = ctx.saved_tensors
        (vocab_start, vocab_valid, temperature), impl, chunk_tokens = ctx.config
        opts = dict(vocab_valid=vocab_valid, temperature=temperature)
        a = grad_log_probs.float() if grad_log_probs is not None else torch.zeros_like(lse)
        b = grad_entropy.float() if grad_entropy is not None else None
        if impl == "triton":
            grad = _backward_triton(logits, labels, vocab_start, lse, entropy, a, b, **opts)
        else:
            grad = _backward_torch(
                logits, labels, vocab_start, lse, entropy, a, b, chunk_tokens, **opts
            )
        return grad, None, None, None, None, None, None


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    compute_entropy: bool = False,
    tp_group=None,
    vocab_start: int | None = None,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    impl: str | None = None,
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Differentiable per-token log-probs and entropy of softmax(logits / temperature).

    Args:
        logits: `[..., V_local]` fp32/bf16/fp16, contiguous: this rank's vocabulary shard
            (the full vocabulary when `tp_group` is None).
        labels: `[...]` int64 global token ids; ids outside `[0, vocab_size)` (e.g. -100
            on padding) give log_prob = -lse, to be masked by the caller.
        compute_entropy: also return the entropy of the full softmax.
        tp_group: torch.distributed group over which the vocabulary is sharded, or None.
        vocab_start: first global id of this shard; default rank * V_local (Megatron's
            equal shards), or 0 without `tp_group`.
        vocab_size: the real (unpadded) global vocabulary size; ids >= it are padding:
            excluded from the softmax and the entropy, zero gradient. None: no padding.
        temperature: T > 0; the distribution is softmax(logits / T).
        impl: "torch" | "triton" | "auto" | None (see `dispatch.select_impl`).
        chunk_tokens: rows per chunk in the torch implementation (bounds its fp32 copy).

    Returns:
        log_probs `[...]` fp32 and entropy `[...]` fp32 (None unless `compute_entropy`).
    """
    check_tensor("logits", logits, dtypes=FLOAT_DTYPES)
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., V], got shape {tuple(logits.shape)}")
    check_tensor(
        "labels", labels, shape=logits.shape[:-1], dtypes=(torch.int64,), device=logits.device
    )
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature={temperature!r} must be a finite number > 0")
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r} must be >= 1 (or None: no padded ids)")
    vocab_local = logits.shape[-1]
    if vocab_start is None:
        vocab_start = 0 if tp_group is None else _tp_rank(tp_group) * vocab_local
    vocab_valid = vocab_local
    if vocab_size is not None:
        vocab_valid = min(vocab_local, max(0, int(vocab_size) - int(vocab_start)))
    impl = select_impl(impl, logits.device)
    flat_logits = logits.reshape(-1, vocab_local)
    out = _VocabParallelLogProb.apply(
        flat_logits,
        labels.reshape(-1),
        (int(vocab_start), vocab_valid, float(temperature)),
        compute_entropy,
        tp_group,
        impl,
        chunk_tokens,
    )
    log_probs, entropy = out if compute_entropy else (out, None)
    log_probs = log_probs.reshape(labels.shape)
    return log_probs, (entropy.reshape(labels.shape) if entropy is not None else None)


def _tp_rank(tp_group) -> int:
    import torch.distributed as dist

    return dist.get_rank(group=tp_group)
