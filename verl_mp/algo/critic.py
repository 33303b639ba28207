"""Critic: clipped value loss and explained variance. Shapes `[B, T]`, fp32 math."""

from __future__ import annotations

import torch

from verl_mp.algo.agg import Count, agg_loss
from verl_mp.algo.utils import as_float_mask, masked_mean, masked_var


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_range_value: float | None,
    loss_agg_mode: str,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    max_response_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip = V_old + clip(V - V_old, +-c).

    `clip_range_value=None` disables clipping. Returns (loss, metrics) with metrics
    ``vf_clipfrac`` (share of tokens where the clipped term is larger) and ``vpred_mean``.
    """
    values, old_values, returns = values.float(), old_values.float(), returns.float()
    loss_plain = (values - returns).square()
    if clip_range_value is None:
        loss_mat = 0.5 * loss_plain
        clipped = torch.zeros_like(loss_plain, dtype=torch.bool)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -clip_range_value, clip_range_value)
        loss_clip = (v_clip - returns).square()
        loss_mat = 0.5 * torch.maximum(loss_plain, loss_clip)
        clipped = loss_clip > loss_plain
    loss = agg_loss(
        loss_mat,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    metrics = {
        "vf_clipfrac": masked_mean(clipped.float(), response_mask).detach(),
        "vpred_mean": masked_mean(values, response_mask).detach(),
    }
    return loss, metrics


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """1 - Var[R - V] / Var[R] over real tokens (0-dim fp32); 0 when Var[R] is 0."""
    mask = as_float_mask(response_mask)
    var_returns = masked_var(returns, mask)
    var_residual = masked_var(returns.float() - values.float(), mask)
    safe = torch.where(var_returns > 0, var_returns, torch.ones_like(var_returns))
    return torch.where(
        var_returns > 0, 1.0 - var_residual / safe, torch.zeros_like(var_returns)
    ).detach()
