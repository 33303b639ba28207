"""Triton kernels for vocab-parallel log-probs + entropy (lazy import by `logprob_loss.py`).

One program per token row streams over its local vocabulary shard in `BLOCK_V` chunks.
Only the first `vocab_valid` columns of a shard are real vocabulary; the rest (Megatron's
padding of the vocabulary to a TP multiple) never enter the softmax and get zero gradient.
The kernels see scaled logits z = logits * inv_temperature.

Forward: online softmax statistics relative to the running max `m` of the row:
    s = sum_v exp(z_v - m),   u = sum_v exp(z_v - m) * (z_v - m),   tgt = z_label
(`u` only with COMPUTE_ENTROPY). These are combined across TP ranks outside the kernel.

Backward: with lse and entropy H known, and a = dL/dlogp, b = dL/dH per row,
    dL/dz_v = a * ([v == label] - p_v) - b * p_v * (log p_v + H),   p_v = exp(z_v - lse)
and dL/dlogits_v = dL/dz_v * inv_temperature (0 on padded columns), written in the
logits dtype. Rows with a = b = 0 (padding) are zero-filled without reading their
logits. Offsets are int64: tokens x vocab exceeds 2^31.
"""

import triton
import triton.language as tl

NEG_BIG = tl.constexpr(
    -1.0e30
)  # finite "minus infinity": keeps (m_old - m_new) * s free of inf * 0


@triton.jit
def logprob_fwd_kernel(
    logits_ptr,
    labels_ptr,
    max_ptr,
    sum_ptr,
    ent_ptr,
    tgt_ptr,
    stride_row,
    vocab_valid,
    vocab_start,
    inv_temperature,
    COMPUTE_ENTROPY: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    m = tl.full([], NEG_BIG, tl.float32)
    s = tl.full([], 0.0, tl.float32)
    u = tl.full([], 0.0, tl.float32)
    for v0 in range(0, vocab_valid, BLOCK_V):
        offs = v0 + cols
        z = tl.load(base + offs, mask=offs < vocab_valid, other=float("-inf")).to(tl.float32)
        z = z * inv_temperature
        m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.exp(m - m_new)
        p = tl.exp(z - m_new)
        if COMPUTE_ENTROPY:
            shifted = p * tl.where(p > 0.0, z - m_new, 0.0)
            u = scale * (u + (m - m_new) * s) + tl.sum(shifted, axis=0)
        s = scale * s + tl.sum(p, axis=0)
        m = m_new
    label = tl.load(labels_ptr + row) - vocab_start
    in_shard = (label >= 0) & (label < vocab_valid)
    tgt = tl.load(base + label, mask=in_shard, other=0.0).to(tl.float32) * inv_temperature
    tl.store(max_ptr + row, m)
    tl.store(sum_ptr + row, s)
    tl.store(tgt_ptr + row, tgt)
    if COMPUTE_ENTROPY:
        tl.store(ent_ptr + row, u)


@triton.jit
def logprob_bwd_kernel(
    logits_ptr,
    grad_ptr,
    labels_ptr,
    lse_ptr,
    entropy_ptr,
    a_ptr,
    b_ptr,
    stride_row,
    grad_stride_row,
    vocab_local,
    vocab_valid,
    vocab_start,
    inv_temperature,
    HAS_ENTROPY_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    gbase = grad_ptr + row * grad_stride_row
    cols = tl.arange(0, BLOCK_V)
    a = tl.load(a_ptr + row)
    lse = tl.load(lse_ptr + row)
    label = tl.load(labels_ptr + row) - vocab_start
    label = tl.where((label >= 0) & (label < vocab_valid), label, -1)  # padded id: no one-hot
    skip = a == 0.0
    if HAS_ENTROPY_GRAD:
        b = tl.load(b_ptr + row)
        h = tl.load(entropy_ptr + row)
        skip = skip & (b == 0.0)
    if skip:
        zeros = tl.zeros([BLOCK_V], dtype=grad_ptr.dtype.element_ty)
        for v0 in range(0, vocab_local, BLOCK_V):
            offs = v0 + cols
            tl.store(gbase + offs, zeros, mask=offs < vocab_local)
    else:
        for v0 in range(0, vocab_local, BLOCK_V):
            offs = v0 + cols
            valid = offs < vocab_valid
            z = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32)
            log_p = z * inv_temperature - lse
            p = tl.exp(log_p)
            g = -a * p
            if HAS_ENTROPY_GRAD:
                g -= b * p * tl.where(p > 0.0, log_p + h, 0.0)
            g += tl.where(offs == label, a, 0.0)
            g = tl.where(valid, g * inv_temperature, 0.0)
            tl.store(gbase + offs, g.to(grad_ptr.dtype.element_ty), mask=offs < vocab_local)
