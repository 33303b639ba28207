"""RMSNorm and SwiGLU for the decoder layer: fused Triton ops on CUDA, plain torch otherwise.

Each op is a function with an ``impl`` switch (`dispatch.select_impl`: argument, else
``VERL_MP_KERNELS``, else Triton for CUDA tensors). The torch path is the model's
reference math, unchanged (autograd through fp32 copies for the norm; ``silu(gate) * up``
for the MLP); the Triton path computes the same function in one pass per direction:

- `rms_norm(x, weight, eps)`: ``weight * cast(x * rsqrt(mean(x^2) + eps))``, the
  statistics in fp32. Saves x and one fp32 ``rstd`` per row, where the torch path keeps an
  fp32 copy of x, ``rstd`` and the normalised x for its backward.
- `swiglu(x)`: ``silu(x[..., :F]) * x[..., F:]`` on megatron's fc1 output. Saves only x;
  the backward recomputes the sigmoid. The torch path keeps ``silu(gate)`` as well.

On the engine's Qwen2-1.5B training step (bf16, 4 x 4096 tokens per micro-batch) these
took a fifth of the GPU time in about 40 small kernels per layer (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_mp.kernels.dispatch import FLOAT_DTYPES, cdiv, check_tensor, count_launch, next_pow2, select_impl


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference: statistics in fp32, normalised x cast back to x's dtype, times weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def swiglu_torch(x: torch.Tensor) -> torch.Tensor:
    """The reference: ``silu(gate) * up`` with ``gate, up = x.chunk(2, -1)``."""
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, impl: str | None = None) -> torch.Tensor:
    """``x [..., H]``, ``weight [H]`` -> ``[..., H]`` in x's dtype (see the module doc)."""
    if select_impl(impl, x.device) == "triton":
        return _RMSNorm.apply(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def swiglu(x: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """``x [..., 2F]`` (gate then up) -> ``[..., F]`` in x's dtype."""
    if x.shape[-1] % 2:
        raise ValueError(f"swiglu needs an even last dimension (gate | up), got shape {tuple(x.shape)}")
    if select_impl(impl, x.device) == "triton":
        return _SwiGLU.apply(x)
    return swiglu_torch(x)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` -> contiguous ``[rows, n]`` (a view when x is contiguous)."""
    return x.contiguous().view(-1, x.shape[-1])


def _warps(block: int) -> int:
    return 8 if block >= 4096 else 4


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        # imported here: triton reads TRITON_INTERPRET when its language module is first imported
        from verl_mp.kernels._layers_triton import rmsnorm_fwd_kernel

        hidden = x.shape[-1]
        x2 = _rows(x)
        check_tensor("rms_norm x", x2, dtypes=FLOAT_DTYPES)
        weight = weight.contiguous()
        check_tensor("rms_norm weight", weight, shape=(hidden,), dtypes=FLOAT_DTYPES)
        if weight.dtype != x.dtype:  # the torch path would promote the output; the kernel writes x's dtype
            raise ValueError(f"rms_norm weight has dtype {weight.dtype}; x has {x.dtype}: they must match")
        y = torch.empty_like(x2)
        rstd = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32)
        block = next_pow2(hidden)
        if x2.shape[0]:
            count_launch("rmsnorm_fwd")
            rmsnorm_fwd_kernel[(x2.shape[0],)](x2, weight, y, rstd, hidden, eps, BLOCK_H=block,
                                               num_warps=_warps(block))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        from verl_mp.kernels._layers_triton import rmsnorm_bwd_kernel  # lazy: reads TRITON_INTERPRET

        x2, weight, rstd = ctx.saved_tensors
        rows, hidden = x2.shape
        g = _rows(grad.to(x2.dtype))
        dx = torch.empty_like(x2)
        per_program = max(1, cdiv(rows, 1024))
        programs = cdiv(rows, per_program) if rows else 0
        dw_part = torch.zeros(max(programs, 1), hidden, device=x2.device, dtype=torch.float32)
        block = next_pow2(hidden)
        if programs:
            count_launch("rmsnorm_bwd")
            rmsnorm_bwd_kernel[(programs,)](x2, weight, g, rstd, dx, dw_part, rows, hidden, per_program,
                                            BLOCK_H=block, num_warps=_warps(block))
        return dx.view(ctx.x_shape), dw_part.sum(0).to(weight.dtype), None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        from verl_mp.kernels._layers_triton import swiglu_fwd_kernel  # lazy: reads TRITON_INTERPRET

        x2 = _rows(x)
        check_tensor("swiglu x", x2, dtypes=FLOAT_DTYPES)
        ffn = x2.shape[1] // 2
        out = torch.empty(x2.shape[0], ffn, device=x.device, dtype=x.dtype)
        if out.numel():
            count_launch("swiglu_fwd")
            swiglu_fwd_kernel[(x2.shape[0], cdiv(ffn, 1024))](x2, out, ffn, BLOCK=1024, num_warps=4)
        ctx.save_for_backward(x2)
        ctx.x_shape = x.shape
        return out.view(*x.shape[:-1], ffn)

    @staticmethod
    def backward(ctx, grad):
        from verl_mp.kernels._layers_triton import swiglu_bwd_kernel  # lazy: reads TRITON_INTERPRET

        (x2,) = ctx.saved_tensors
        ffn = x2.shape[1] // 2
        g = _rows(grad.to(x2.dtype))
        dx = torch.empty_like(x2)
        if g.numel():
            count_launch("swiglu_bwd")
            swiglu_bwd_kernel[(x2.shape[0], cdiv(ffn, 1024))](x2, g, dx, ffn, BLOCK=1024, num_warps=4)
        return dx.view(ctx.x_shape)


class SwiGLU(torch.nn.Module):
    """megatron MLP's activation module (``MLPSubmodules.activation_func``): `swiglu` on the
    whole fc1 output. megatron applies such a module when ``config.use_te_activation_func``
    is set (the name is megatron's; transformer-engine is not involved here)."""

    def __init__(self, config=None):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """No parameters: nothing in megatron's distributed checkpoint."""
        return {}
