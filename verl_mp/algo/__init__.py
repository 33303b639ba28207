"""The algorithm core: pure tensor functions and the registries users extend.

No torch.distributed, Ray or Megatron here. Everything computes in fp32. Registries map
a name (or a ``"module:function"`` plugin path) to a function of a fixed signature:

- `ADVANTAGE_ESTIMATORS`: ``(token_level_rewards, response_mask, **inputs, **params) ->
  (advantages, returns)``; each entry declares what it needs (`EstimatorSpec`: batch
  inputs such as values or group ids, and config parameters), so the trainer computes
  advantages with one generic call and runs a critic exactly when one is needed
- `POLICY_LOSSES`: ``(log_probs, old_log_probs, advantages, response_mask, *, clip_low,
  clip_high, clip_ratio_c, loss_agg_mode, ...) -> (loss, metrics)``
- `KL_ESTIMATORS`: ``(log_probs, ref_log_probs) -> kl [B, T]``
- `ROLLOUT_IS`, `ROLLOUT_MASKS`: importance weights and rejection masks for the mismatch
  between the rollout's policy and the trainer's (`rollout_correction` composes them)

See docs/algorithms.md for formulas and the contract for global token counts.
"""

from verl_mp.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    BATCH_INPUTS,
    EstimatorSpec,
    advantage_estimator,
    estimator_spec,
    gae,
    gae_scan_torch,
    group_outcome_torch,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
)
from verl_mp.algo.agg import AGG_MODES, agg_loss, agg_weights
from verl_mp.algo.critic import explained_variance, value_loss
from verl_mp.algo.entropy import entropy_bonus, entropy_from_logits, log_probs_from_logits
from verl_mp.algo.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_loss,
)
from verl_mp.algo.policy_loss import POLICY_LOSSES, clipped_surrogate, gspo, pg, ppo
from verl_mp.algo.registry import Registry, UnknownNameError, resolve
from verl_mp.algo.rollout_correction import ROLLOUT_IS, ROLLOUT_MASKS, rollout_correction
from verl_mp.algo.utils import masked_mean, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "BATCH_INPUTS",
    "EstimatorSpec",
    "advantage_estimator",
    "estimator_spec",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "ROLLOUT_IS",
    "ROLLOUT_MASKS",
    "AdaptiveKLController",
    "FixedKLController",
    "Registry",
    "UnknownNameError",
    "agg_loss",
    "agg_weights",
    "apply_kl_penalty",
    "clipped_surrogate",
    "entropy_bonus",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "gae_scan_torch",
    "group_outcome_torch",
    "grpo",
    "gspo",
    "kl_loss",
    "log_probs_from_logits",
    "masked_mean",
    "masked_whiten",
    "pg",
    "ppo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "resolve",
    "rloo",
    "rollout_correction",
    "value_loss",
]
