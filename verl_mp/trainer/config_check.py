"""The checks of a run configuration that need neither the model nor the data: every mistake
at once, within seconds, before any download, warm start or process (`verl-mp train` runs
them before preparing the demo; `verl_mp.trainer.setup.preflight` runs them first). Each
check lives in the layer that owns its settings; this is the order they run in. Kept apart
from `verl_mp.trainer.setup`, whose imports (pyarrow, the planner, the reward workers) would
slow this exit."""

from __future__ import annotations

import os

from verl_mp.algo.checks import name_errors
from verl_mp.config.checks import check_filter_groups, check_generation_lengths, check_mini_batch, check_rollout_pool
from verl_mp.config.placement import Placement, resolve_placement
from verl_mp.config.rollout import validate_sync_mode
from verl_mp.config.schema import LAUNCHERS, RootConfig
from verl_mp.plan import critic_enabled, enabled_roles
from verl_mp.reward.registry import check_reward_fns
from verl_mp.utils.errors import ErrorCollector
from verl_mp.utils.launch import check_local_ranks


def config_errors(cfg: RootConfig) -> list[str]:
    """Every check that needs neither the model nor the data (names, plugins, placement,
    batch sizes, lengths): one message per mistake. Seconds, before any download, warm start
    or process (`verl-mp train` runs it before preparing the demo)."""
    errors = ErrorCollector()
    config_checks(cfg, errors)
    return errors.messages


def config_checks(cfg: RootConfig, errors: ErrorCollector) -> Placement | None:
    """The checks of `config_errors`, each in the layer that owns its settings, into
    ``errors``; returns the placement (None if invalid)."""
    t = cfg.trainer
    if t.launcher not in LAUNCHERS:
        errors.messages.append(f"trainer.launcher={t.launcher!r} is not one of {LAUNCHERS}")
    errors.run(check_local_ranks, t.nproc, "trainer.nproc")
    names = name_errors(cfg)
    errors.messages += names
    errors.run(check_reward_fns, cfg.reward)
    # CUDA is checked in the workers (make_weight_sync): a Ray driver may have no GPU itself.
    errors.run(validate_sync_mode, cfg.rollout.weight_sync_mode, cfg.actor.megatron.tensor_model_parallel_size,
               cfg.rollout.tensor_model_parallel_size, cfg.rollout.backend, cuda=True)
    errors.run(check_mini_batch, cfg)
    errors.run(check_generation_lengths, cfg)
    errors.run(check_filter_groups, cfg)
    if names:
        return None  # which roles run follows from the estimator
    placement = errors.run(resolve_placement, t, enabled_roles(cfg))
    if placement is None:
        return None
    if t.launcher == "ray" and not os.environ.get("RAY_ADDRESS"):  # a local Ray on this machine
        if placement.multi_node:
            errors.messages.append(f"trainer.placement pools {placement.pools} span several nodes (trainer.nnodes="
                                   f"{t.nnodes}): start a Ray cluster (ray start) and set RAY_ADDRESS")
        else:
            errors.run(check_local_ranks, placement.num_ranks, "the ranks of all trainer.placement pools together")
    errors.run(check_rollout_pool, cfg, placement, critic_enabled(cfg))
    return placement
