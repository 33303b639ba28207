"""Launcher for the fused GAE reverse-scan kernel.

The pure-torch reference is `verl_mp.algo.advantages.gae_scan_torch`; the estimator
`verl_mp.algo.advantages.gae` chooses between the two with `dispatch.select_impl`.
"""

from __future__ import annotations

import torch

from verl_mp.kernels.dispatch import (
    FLOAT_DTYPES,
    MASK_DTYPES,
    cdiv,
    check_tensor,
    count_launch,
    mask_for_kernel,
    next_pow2,
)


def gae_launch_config(num_rows: int, num_steps: int) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_T, num_warps) for a `[num_rows, num_steps]` problem.

    Tiles of 256 elements on 2 warps: the work per row is a chain of tiles, so the kernel
    is bound by latency, and small programs (many resident per SM, next tile prefetched)
    win. On an H200 at B=1024, T=4096 this ran in 37 us against 41-78 us for tiles of
    512-1024 elements (benchmarks/RESULTS.md). Short rows get several rows per tile.
    """
    block_t = min(next_pow2(num_steps), 256)
    block_b = max(1, min(256 // block_t, next_pow2(num_rows)))
    return block_b, block_t, 2


def gae_triton(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    *,
    block_b: int | None = None,
    block_t: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns, un-whitened, zero on padding.

    Args:
        token_level_rewards: `[B, T]` fp32/bf16/fp16, contiguous.
        values: `[B, T]` fp32/bf16/fp16, contiguous.
        response_mask: `[B, T]` bool/int/float, contiguous; padding is skipped (a
            masked step carries the next real token's value and advantage through).
        gamma, lam: discount and GAE lambda.

    Returns:
        advantages, returns: `[B, T]` fp32.
    """
    check_tensor("token_level_rewards", token_level_rewards, ndim=2, dtypes=FLOAT_DTYPES)
    shape, device = token_level_rewards.shape, token_level_rewards.device
    check_tensor("values", values, shape=shape, dtypes=FLOAT_DTYPES, device=device)
    check_tensor("response_mask", response_mask, shape=shape, dtypes=MASK_DTYPES, device=device)
    num_rows, num_steps = shape
    adv = torch.empty(shape, dtype=torch.float32, device=device)
    ret = torch.empty(shape, dtype=torch.float32, device=device)
    if adv.numel() == 0:
        return adv, ret
    default_b, default_t, default_w = gae_launch_config(num_rows, num_steps)
    block_b, block_t = block_b or default_b, block_t or default_t
    from verl_mp.kernels._gae_triton import gae_kernel  # lazy: reads TRITON_INTERPRET

    grid = (cdiv(num_rows, block_b),)
    count_launch("gae")
    gae_kernel[grid](
        token_level_rewards,
        values,
        mask_for_kernel(response_mask),
        adv,
        ret,
        num_rows,
        num_steps,
        float(gamma),
        float(lam),
        BLOCK_B=block_b,
        BLOCK_T=block_t,
        num_warps=num_warps or default_w,
    )
    return adv, ret
