"""Policy losses: ``POLICY_LOSSES[name](log_probs, old_log_probs, advantages, response_mask,
*, clip_low, clip_high, clip_ratio_c, loss_agg_mode, global_num_tokens=None,
global_num_seqs=None, max_response_len=None, token_weights=None) -> (loss, metrics)``.

``token_weights`` `[B, T]` (None: all 1) are constants multiplying the per-token loss
before aggregation: the rollout corrections' importance weights and rejection masks
(`verl_mp.algo.rollout_correction`). The trainer passes it only when a correction is on,
so a plugin without the argument works until one is turned on (preflight then says so).

Inputs are `[B, T]`; the loss is a 0-dim fp32 tensor aggregated by `agg_loss` (the count
arguments are passed through; see `verl_mp.algo.agg` for how a trainer fills them).
Metrics are detached 0-dim tensors computed over this call's real tokens (no device
sync): ``clipfrac``, ``clipfrac_lower``, ``approx_kl`` (k1 of old vs new), ``ratio_max``,
``ratio_min``. The log-ratio is clamped to +-20 before `exp` for stability.
"""

from __future__ import annotations

import torch

from verl_mp.algo.agg import agg_loss
from verl_mp.algo.registry import Registry
from verl_mp.algo.utils import masked_max, masked_mean, masked_min

POLICY_LOSSES = Registry("policy loss")
LOG_RATIO_CLAMP = 20.0


def _ratio_metrics(log_ratio, ratio, response_mask) -> dict[str, torch.Tensor]:
    """Metrics shared by every loss, from the detached token-level log-ratio `[B, T]`."""
    return {
        "approx_kl": masked_mean(-log_ratio, response_mask).detach(),
        "ratio_max": masked_max(ratio, response_mask, empty=1.0).detach(),
        "ratio_min": masked_min(ratio, response_mask, empty=1.0).detach(),
    }


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-clip per-token loss `[B, T]` with asymmetric clipping and optional dual clip.

    Returns (loss_mat, clipped, dual_clipped): the last two are bool `[B, T]` marking where
    the upper (clip) bound and the dual-clip lower bound are active.
    """
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    dual = torch.zeros_like(clipped)
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(
                f"clip_ratio_c={clip_ratio_c} must be > 1 (or None to disable dual clip)"
            )
        bound = -advantages * clip_ratio_c
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, clipped, dual


def _weighted(loss_mat: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    """``loss_mat * token_weights`` (constants), or ``loss_mat`` when there are none."""
    if token_weights is None:
        return loss_mat
    if token_weights.shape != loss_mat.shape:
        raise ValueError(f"token_weights shape {tuple(token_weights.shape)} != log_probs shape "
                         f"{tuple(loss_mat.shape)}")
    return loss_mat * token_weights.detach().float()


def _check_shapes(log_probs, old_log_probs, advantages, response_mask) -> None:
    for name, t in (
        ("old_log_probs", old_log_probs),
        ("advantages", advantages),
        ("response_mask", response_mask),
    ):
        if t.shape != log_probs.shape:
            raise ValueError(
                f"{name} shape {tuple(t.shape)} != log_probs shape {tuple(log_probs.shape)}"
            )


@POLICY_LOSSES.register("ppo")
def ppo(
    log_probs,
    old_log_probs,
    advantages,
    response_mask,
    *,
    clip_low,
    clip_high,
    clip_ratio_c,
    loss_agg_mode,
    global_num_tokens=None,
    global_num_seqs=None,
    max_response_len=None,
    token_weights=None,
):
    """PPO clipped surrogate; ratio = exp(log_probs - old_log_probs) per token.

    `clip_low`/`clip_high` give the range [1 - clip_low, 1 + clip_high] (DAPO's
    clip-higher when they differ); `clip_ratio_c` (> 1) bounds the loss of negative
    advantages from below (dual clip), None disables it.
    """
    _check_shapes(log_probs, old_log_probs, advantages, response_mask)
    log_ratio = torch.clamp(
        log_probs.float() - old_log_probs.float(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    ratio = torch.exp(log_ratio)
    loss_mat, clipped, dual = clipped_surrogate(
        ratio, advantages.float(), clip_low, clip_high, clip_ratio_c
    )
    metrics = _ratio_metrics(log_ratio.detach(), ratio.detach(), response_mask)
    metrics["clipfrac"] = masked_mean(clipped.float(), response_mask).detach()
    metrics["clipfrac_lower"] = masked_mean(dual.float(), response_mask).detach()
    loss = agg_loss(
        _weighted(loss_mat, token_weights),
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo(
    log_probs,
    old_log_probs,
    advantages,
    response_mask,
    *,
    clip_low,
    clip_high,
    clip_ratio_c,
    loss_agg_mode,
    global_num_tokens=None,
    global_num_seqs=None,
    max_response_len=None,
    token_weights=None,
):
    """GSPO: clip the sequence-level ratio s_i = exp(mean_t(log_probs - old_log_probs)).

    Token form (GSPO paper, eq. 10): s_it = sg[s_i] * pi_t / sg[pi_t], so every token of a
    sequence carries the value s_i and its own gradient. `clip_ratio_c` is not used (the
    paper has no dual clip). The paper aggregates with "seq-mean-token-mean".
    """
    _check_shapes(log_probs, old_log_probs, advantages, response_mask)
    mask = (response_mask != 0).float()
    log_probs = log_probs.float()
    token_log_ratio = log_probs - old_log_probs.float()
    seq_log_ratio = (token_log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    log_ratio = seq_log_ratio.detach()[:, None] + log_probs - log_probs.detach()
    log_ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_mat, clipped, _ = clipped_surrogate(ratio, advantages.float(), clip_low, clip_high, None)
    metrics = _ratio_metrics(token_log_ratio.detach(), ratio.detach(), response_mask)
    metrics["clipfrac"] = masked_mean(clipped.float(), response_mask).detach()
    metrics["clipfrac_lower"] = torch.zeros((), device=log_probs.device)
    loss = agg_loss(
        _weighted(loss_mat, token_weights),
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    return loss, metrics


@POLICY_LOSSES.register("pg")
def pg(
    log_probs,
    old_log_probs,
    advantages,
    response_mask,
    *,
    clip_low,
    clip_high,
    clip_ratio_c,
    loss_agg_mode,
    global_num_tokens=None,
    global_num_seqs=None,
    max_response_len=None,
    token_weights=None,
):
    """Plain policy gradient (REINFORCE): loss = -advantages * log_probs, no ratio, no
    clipping (the clip arguments are unused; `old_log_probs` feeds the metrics only)."""
    _check_shapes(log_probs, old_log_probs, advantages, response_mask)
    log_probs = log_probs.float()
    loss_mat = -advantages.float() * log_probs
    log_ratio = torch.clamp(
        log_probs.detach() - old_log_probs.float(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP
    )
    metrics = _ratio_metrics(log_ratio, torch.exp(log_ratio), response_mask)
    metrics["clipfrac"] = torch.zeros((), device=log_probs.device)
    metrics["clipfrac_lower"] = torch.zeros((), device=log_probs.device)
    loss = agg_loss(
        _weighted(loss_mat, token_weights),
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    return loss, metrics
