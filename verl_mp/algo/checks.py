"""The run configuration's algorithm names against the registries: every estimator, loss, KL
estimator and correction level resolves (a registered name or a loadable plugin), and the
policy loss takes the weights the rollout correction passes."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from verl_mp.algo.advantages import ADVANTAGE_ESTIMATORS
from verl_mp.algo.kl import KL_ESTIMATORS
from verl_mp.algo.policy_loss import POLICY_LOSSES
from verl_mp.algo.rollout_correction import ROLLOUT_IS, ROLLOUT_MASKS
from verl_mp.config.schema import CORRECTION_OFF
from verl_mp.utils.errors import ErrorCollector

if TYPE_CHECKING:
    from verl_mp.config.schema import RootConfig


def name_errors(cfg: RootConfig) -> list[str]:
    """One message per name of ``cfg`` that does not resolve (each naming its key); the
    correction levels are checked once the losses resolve. Empty when all do."""
    errors = ErrorCollector()
    for key, registry, name in (("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, cfg.algorithm.adv_estimator),
                                ("actor.policy_loss", POLICY_LOSSES, cfg.actor.policy_loss),
                                ("actor.kl_loss_type", KL_ESTIMATORS, cfg.actor.kl_loss_type),
                                ("algorithm.kl_penalty", KL_ESTIMATORS, cfg.algorithm.kl_penalty)):
        errors.run(registry.lookup, key, name)
    if not errors.messages:
        errors.run(_check_rollout_correction, cfg)
    return errors.messages


def _check_rollout_correction(cfg: RootConfig) -> None:
    """Correction levels resolve, and the policy loss takes the weights they produce."""
    rc = cfg.algorithm.rollout_correction
    for key, registry, name in (("algorithm.rollout_correction.is_level", ROLLOUT_IS, rc.is_level),
                                ("algorithm.rollout_correction.mask_level", ROLLOUT_MASKS, rc.mask_level)):
        if name != CORRECTION_OFF:
            registry.lookup(key, name)
    if not rc.enabled:
        return
    params = inspect.signature(POLICY_LOSSES[cfg.actor.policy_loss]).parameters
    if "token_weights" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"actor.policy_loss={cfg.actor.policy_loss!r} takes no token_weights argument, which "
                         "algorithm.rollout_correction passes (per-token weights multiplying the loss before "
                         "aggregation); add it to the plugin or turn the correction off")
