"""Launcher for the group-normalised outcome advantage kernel (GRPO, Dr.GRPO, RLOO).

The pure-torch reference is `verl_mp.algo.advantages.group_outcome_torch`.
"""

from __future__ import annotations

import torch

from verl_mp.kernels.dispatch import (
    FLOAT_DTYPES,
    MASK_DTYPES,
    check_tensor,
    count_launch,
    mask_for_kernel,
    next_pow2,
)

GROUP_MODES = {"mean": 0, "std": 1, "rloo": 2}


def group_advantages_triton(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    mode: str,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Outcome advantages normalised within groups of samples of the same prompt.

    Args:
        token_level_rewards: `[B, T]` fp32/bf16/fp16, contiguous; the outcome score of a
            sample is the sum over its real tokens.
        response_mask: `[B, T]` bool/int/float, contiguous.
        group_ids: `[B]` int64 (any values, any order; equal ids form a group).
        mode: "std" (score-mean)/(std+eps) with unbiased std, "mean" (score-mean),
            "rloo" (score minus the mean of the other members).
        eps: added to the std in "std" mode.

    Returns:
        advantages `[B, T]` fp32 (per-sample value on real tokens, 0 elsewhere; 0 for
        groups of one), scores `[B]` fp32, group_sizes `[B]` int32.
    """
    if mode not in GROUP_MODES:
        raise ValueError(f"group advantage mode {mode!r} must be one of {sorted(GROUP_MODES)}")
    check_tensor("token_level_rewards", token_level_rewards, ndim=2, dtypes=FLOAT_DTYPES)
    shape, device = token_level_rewards.shape, token_level_rewards.device
    check_tensor("response_mask", response_mask, shape=shape, dtypes=MASK_DTYPES, device=device)
    check_tensor("group_ids", group_ids, shape=shape[:1], dtypes=(torch.int64,), device=device)
    num_rows, num_steps = shape
    adv = torch.empty(shape, dtype=torch.float32, device=device)
    scores = torch.empty(num_rows, dtype=torch.float32, device=device)
    sizes = torch.empty(num_rows, dtype=torch.int32, device=device)
    if num_rows == 0:
        return adv, scores, sizes
    from verl_mp.kernels._group_adv_triton import group_adv_kernel  # lazy: reads TRITON_INTERPRET

    block_ids = min(next_pow2(num_rows), 1024)
    block_t = max(16, min(next_pow2(num_steps), 1024))
    count_launch("group_adv")
    group_adv_kernel[(num_rows,)](
        token_level_rewards,
        mask_for_kernel(response_mask),
        group_ids,
        adv,
        scores,
        sizes,
        num_rows,
        num_steps,
        float(eps),
        MODE=GROUP_MODES[mode],
        BLOCK_IDS=block_ids,
        BLOCK_M=4,
        BLOCK_T=block_t,
        num_warps=4,
    )
    return adv, scores, sizes
