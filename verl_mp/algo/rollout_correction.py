"""Corrections for the mismatch between the rollout's policy and the trainer's.

The rollout engine samples from its own policy, pi_rollout: other kernels and precision
than the trainer, and with ``trainer.off_policy_steps > 0`` weights up to K updates old.
The policy loss treats the samples as drawn from pi_old, the actor before this update
(the ``old_log_probs`` the trainer recomputes). Per token, the log-ratio

    log r_t = log pi_old(y_t) - log pi_rollout(y_t)

measures the mismatch (0 when both agree). A correction turns it into per-token weights
``[B, T]`` (constants: no gradient) that multiply the per-token policy-gradient term
(`verl_mp.algo.policy_loss`, ``token_weights``). Two registries, each entry a function of
one signature:

- `ROLLOUT_IS` (importance sampling), ``fn(log_ratio, response_mask, *, threshold) ->
  (weights, metrics)``: ``token`` (truncated IS, TIS): ``w_t = min(r_t, threshold)``;
  ``sequence``: ``w = min(prod_t r_t, threshold)`` on every token of the sequence.
- `ROLLOUT_MASKS` (rejection), ``fn(log_ratio, response_mask, *, low, high) -> (keep,
  metrics)``: ``token``: 0 where ``r_t`` leaves ``[low, high]`` ("icepop"-style);
  ``sequence``: 0 on every token of a sequence whose geometric-mean ratio
  ``exp(mean_t log r_t)`` leaves the band (the product's range grows with the length, so a
  fixed band on it would reject long responses).

`rollout_correction` composes one of each (weights x keep). Log-ratios are clamped to
+-20 before ``exp``. Metrics are floats over real tokens (``rollout_corr/...``).
"""

from __future__ import annotations

import torch

from verl_mp.algo.registry import Registry
from verl_mp.algo.utils import as_float_mask, masked_max, masked_mean

ROLLOUT_IS = Registry("rollout importance sampling level")
ROLLOUT_MASKS = Registry("rollout rejection mask level")
LOG_RATIO_CLAMP = 20.0
NONE = "none"
"""The level that turns a correction off (not a registry entry)."""


def _stats(values: torch.Tensor, keep: torch.Tensor) -> tuple[float, float, float]:
    """(mean, max, min) of ``values`` where ``keep`` is set; all 1 when nothing is."""
    if not bool(keep.any()):
        return 1.0, 1.0, 1.0
    picked = values[keep]
    return picked.mean().item(), picked.max().item(), picked.min().item()


def sequence_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` sum over real tokens of the per-token log-ratio (log of the product ratio)."""
    return (log_ratio.float() * as_float_mask(response_mask)).sum(-1)


@ROLLOUT_IS.register("token")
def token_is(log_ratio: torch.Tensor, response_mask: torch.Tensor, *, threshold: float):
    """Truncated per-token importance weights ``min(r_t, threshold)`` ``[B, T]`` (0 on padding)."""
    mask = as_float_mask(response_mask)
    ratio = torch.exp(log_ratio.float().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weights = ratio.clamp(max=threshold) * mask
    real = mask > 0
    truncated = ((ratio > threshold) & real).float().sum() / mask.sum().clamp(min=1.0)
    mean, high, _ = _stats(weights, real)
    return weights, {"rollout_corr/is_truncated_frac": truncated.item(),
                     "rollout_corr/is_weight_mean": mean, "rollout_corr/is_weight_max": high}


@ROLLOUT_IS.register("sequence")
def sequence_is(log_ratio: torch.Tensor, response_mask: torch.Tensor, *, threshold: float):
    """The truncated sequence weight ``min(prod_t r_t, threshold)`` on every real token."""
    mask = as_float_mask(response_mask)
    seq_ratio = torch.exp(sequence_log_ratio(log_ratio, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    seq_weight = seq_ratio.clamp(max=threshold)
    real_seq = mask.sum(-1) > 0
    truncated = ((seq_ratio > threshold) & real_seq).float().sum() / real_seq.float().sum().clamp(min=1.0)
    mean, high, _ = _stats(seq_weight, real_seq)
    ratio_mean, ratio_max, _ = _stats(seq_ratio, real_seq)
    return seq_weight[:, None] * mask, {
        "rollout_corr/is_truncated_frac": truncated.item(), "rollout_corr/is_weight_mean": mean,
        "rollout_corr/is_weight_max": high, "rollout_corr/seq_ratio_mean": ratio_mean,
        "rollout_corr/seq_ratio_max": ratio_max}


@ROLLOUT_MASKS.register("token")
def token_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, *, low: float, high: float):
    """1 on real tokens whose ratio is inside ``[low, high]``, 0 elsewhere ``[B, T]``."""
    mask = as_float_mask(response_mask)
    ratio = torch.exp(log_ratio.float().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    keep = ((ratio >= low) & (ratio <= high)).float() * mask
    masked = (mask - keep).sum() / mask.sum().clamp(min=1.0)
    return keep, {"rollout_corr/masked_token_frac": masked.item()}


@ROLLOUT_MASKS.register("sequence")
def sequence_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, *, low: float, high: float):
    """1 on every real token of the sequences whose geometric-mean ratio is inside the band."""
    mask = as_float_mask(response_mask)
    lengths = mask.sum(-1)
    geo = torch.exp((sequence_log_ratio(log_ratio, mask) / lengths.clamp(min=1.0))
                    .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    keep_seq = (geo >= low) & (geo <= high)
    keep = keep_seq.float()[:, None] * mask
    real_seq = lengths > 0
    dropped = (~keep_seq & real_seq).float().sum() / real_seq.float().sum().clamp(min=1.0)
    return keep, {"rollout_corr/masked_seq_frac": dropped.item(),
                  "rollout_corr/masked_token_frac": ((mask - keep).sum() / mask.sum().clamp(min=1.0)).item()}


def rollout_correction(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                       response_mask: torch.Tensor, *, is_level: str = NONE, is_threshold: float = 2.0,
                       mask_level: str = NONE, mask_low: float = 0.5, mask_high: float = 2.0,
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights ``[B, T]`` fp32 (0 on padding) = IS weights x rejection mask, and
    metrics: the token ratio's mean/max/min over real tokens, the final weights' mean, and
    what each part reports (fraction truncated, fraction masked). ``is_level`` and
    ``mask_level``: names in `ROLLOUT_IS` / `ROLLOUT_MASKS`, ``module:function`` plugins,
    or ``"none"``."""
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(f"old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs "
                         f"{tuple(rollout_log_probs.shape)} and response_mask {tuple(response_mask.shape)} must match")
    mask = as_float_mask(response_mask)
    log_ratio = (old_log_probs.float() - rollout_log_probs.float()) * mask
    real = mask > 0
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    mean, high, low = _stats(ratio, real)
    metrics = {"rollout_corr/ratio_mean": mean, "rollout_corr/ratio_max": high, "rollout_corr/ratio_min": low}
    weights = mask
    if is_level != NONE:
        is_weights, m = ROLLOUT_IS[is_level](log_ratio, mask, threshold=is_threshold)
        weights, metrics = weights * is_weights, {**metrics, **m}
    if mask_level != NONE:
        keep, m = ROLLOUT_MASKS[mask_level](log_ratio, mask, low=mask_low, high=mask_high)
        weights, metrics = weights * keep, {**metrics, **m}
    metrics["rollout_corr/weight_mean"] = _stats(weights, real)[0]
    return weights.detach(), metrics


LOGPROB_GAP_METRICS = ("logprob_diff_max", "logprob_diff_mean", "prob_diff_max", "prob_diff_mean")
"""The names `logprob_gap` returns."""


def logprob_gap(trainer_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """|rollout - trainer| of log-probs, and of probabilities (|exp(a) - exp(b)|: what verl logs
    as ``training/rollout_probs_diff_*``), over the tokens where ``mask`` is non-zero: the
    maxima (0 without tokens) and the means, 0-dim fp32 tensors, by masked reductions (no
    indexing, no device sync). Keys: `LOGPROB_GAP_METRICS`."""
    trainer, rollout = trainer_log_probs.float(), rollout_log_probs.float()
    diff, prob_diff = (trainer - rollout).abs(), (trainer.exp() - rollout.exp()).abs()
    return {"logprob_diff_max": masked_max(diff, mask, empty=0.0), "logprob_diff_mean": masked_mean(diff, mask),
            "prob_diff_max": masked_max(prob_diff, mask, empty=0.0), "prob_diff_mean": masked_mean(prob_diff, mask)}
