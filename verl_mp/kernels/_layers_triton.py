"""Triton kernels for the decoder layer's memory-bound parts (lazy import by `layers.py`).

RMSNorm, ``y = w * cast(x * rstd)`` with ``rstd = 1 / sqrt(mean(x^2) + eps)`` per row:
- forward: one program per row; writes ``y`` in x's dtype and ``rstd`` fp32 (the only
  thing saved besides x);
- backward: each program walks a block of rows. With ``gw = g * w`` and ``xh = x * rstd``:
  ``dx = rstd * (gw - xh * mean(gw * xh))``; ``g * cast(xh)`` is summed over the block's
  rows in fp32 into one partial row of dw (the caller sums the partial rows).

SwiGLU on megatron's fc1 output ``x = [gate | up]`` (last dim 2F):
- forward: ``out = silu(gate) * up``;
- backward: ``d_gate = g * up * s * (1 + gate * (1 - s))``, ``d_up = g * silu(gate)``,
  ``s = sigmoid(gate)``, written side by side into ``dx [.., 2F]``; only x is saved.
Everything is computed in fp32 and stored in the input dtype. Offsets are int64.
"""

import triton
import triton.language as tl


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, hidden, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    keep = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=keep, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    xh = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)  # the torch path's cast before * w
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * hidden + cols, (w * xh).to(y_ptr.dtype.element_ty), mask=keep)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def rmsnorm_bwd_kernel(x_ptr, w_ptr, g_ptr, rstd_ptr, dx_ptr, dw_part_ptr, rows, hidden, rows_per_program,
                       BLOCK_H: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    keep = cols < hidden
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_H], dtype=tl.float32)
    first = pid * rows_per_program
    for i in range(0, rows_per_program):
        row = first + i
        if row < rows:
            x = tl.load(x_ptr + row * hidden + cols, mask=keep, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * hidden + cols, mask=keep, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            xh = x * rstd
            dw += g * xh.to(dx_ptr.dtype.element_ty).to(tl.float32)
            gw = g * w
            dx = rstd * (gw - xh * (tl.sum(gw * xh, axis=0) / hidden))
            tl.store(dx_ptr + row * hidden + cols, dx.to(dx_ptr.dtype.element_ty), mask=keep)
    tl.store(dw_part_ptr + pid * hidden + cols, dw, mask=keep)


@triton.jit
def swiglu_fwd_kernel(x_ptr, out_ptr, ffn, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < ffn
    gate = tl.load(x_ptr + row * 2 * ffn + cols, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * ffn + ffn + cols, mask=keep, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * ffn + cols, out.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def swiglu_bwd_kernel(x_ptr, g_ptr, dx_ptr, ffn, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < ffn
    gate = tl.load(x_ptr + row * 2 * ffn + cols, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * ffn + ffn + cols, mask=keep, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * ffn + cols, mask=keep, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    d_gate = g * up * s * (1.0 + gate * (1.0 - s))
    d_up = g * gate * s
    tl.store(dx_ptr + row * 2 * ffn + cols, d_gate.to(dx_ptr.dtype.element_ty), mask=keep)
    tl.store(dx_ptr + row * 2 * ffn + ffn + cols, d_up.to(dx_ptr.dtype.element_ty), mask=keep)
