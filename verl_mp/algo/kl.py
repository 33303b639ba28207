"""KL estimators and coefficient controllers.

``KL_ESTIMATORS[name](log_probs, ref_log_probs) -> [B, T]`` fp32, per-token estimates of
KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3):
- ``k1``: log pi - log pi_ref (unbiased, high variance, can be negative);
- ``k2``: 0.5 * (log pi - log pi_ref)^2;
- ``k3`` (= ``low_var_kl``): r - log r - 1 with r = pi_ref / pi, clamped to [-10, 10];
- ``abs``: |log pi - log pi_ref|.
They are used either as a loss term (`kl_loss`, GRPO) or as a per-token penalty on the
reward (`apply_kl_penalty`, PPO) with a `FixedKLController` or `AdaptiveKLController`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_mp.algo.agg import Count, agg_loss
from verl_mp.algo.registry import Registry
from verl_mp.algo.utils import as_float_mask, masked_mean

KL_ESTIMATORS = Registry("KL estimator")
_K3_CLAMP = 10.0
_LOG_RATIO_CLAMP = 20.0


@KL_ESTIMATORS.register("k1")
def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref, `[B, T]`."""
    return log_probs.float() - ref_log_probs.float()


@KL_ESTIMATORS.register("k2")
def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """0.5 * (log pi - log pi_ref)^2, `[B, T]`."""
    return 0.5 * (log_probs.float() - ref_log_probs.float()).square()


@KL_ESTIMATORS.register("k3")
def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """exp(d) - d - 1 with d = log pi_ref - log pi (clamped to +-20), result clamped to
    [-10, 10]; non-negative and low-variance. `[B, T]`."""
    d = torch.clamp(ref_log_probs.float() - log_probs.float(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(d) - d - 1.0, -_K3_CLAMP, _K3_CLAMP)


@KL_ESTIMATORS.register("abs")
def abs_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """|log pi - log pi_ref|, `[B, T]`."""
    return (log_probs.float() - ref_log_probs.float()).abs()


KL_ESTIMATORS.add("low_var_kl", k3)


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    estimator: str,
    loss_agg_mode: str,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    max_response_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL loss term (to be scaled by the KL loss coefficient): (loss, {"kl_loss": ...})."""
    kl = KL_ESTIMATORS[estimator](log_probs, ref_log_probs)
    loss = agg_loss(
        kl,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    return loss, {"kl_loss": loss.detach()}


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """token_level_rewards = scores - kl_coef * KL per real token, `[B, T]` fp32.

    Metrics: ``kl`` (mean over sequences of the per-sequence mean KL; feed it to the
    controller's `update`) and ``kl_coef``.
    """
    mask = as_float_mask(response_mask)
    kl = KL_ESTIMATORS[estimator](log_probs, ref_log_probs) * mask
    rewards = token_level_scores.float() * mask - kl_coef * kl
    current_kl = masked_mean(kl, mask, dim=-1).mean()
    return rewards, {"kl": current_kl.detach(), "kl_coef": torch.tensor(float(kl_coef))}


@dataclass
class FixedKLController:
    """A constant KL coefficient."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (same interface as the adaptive controller)."""


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): moves `value` so that the measured
    KL approaches `target_kl`, at a rate set by `horizon` (in samples)."""

    value: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(
                f"target_kl={self.target_kl} and horizon={self.horizon} must be positive"
            )

    def update(self, current_kl: float, n_steps: int) -> None:
        """current_kl: measured KL of the last batch; n_steps: samples in that batch."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
