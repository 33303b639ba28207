"""Everything the driver needs besides the workers: tokenizer, datasets, sampler, reward.

Also `preflight`, the order of every check that runs before any process starts (those that
need no model or data first: `verl_mp.trainer.config_check`); each check lives in the layer
that owns its settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from verl_mp.config.checks import (
    check_batch_sizes,
    check_max_model_len,
    check_moe,
    check_multi_turn,
    check_rollout_model,
    model_dir_exists,
    path_errors,
)
from verl_mp.config.parallel import validate_layout
from verl_mp.config.rollout import validate_rollout_layout
from verl_mp.config.schema import RootConfig
from verl_mp.data.dataset import PromptDataset
from verl_mp.data.sampler import ResumableBatchSampler
from verl_mp.data.tokenizer import check_vocab, load_tokenizer
from verl_mp.models.hf_config import spec_from_model_dir
from verl_mp.plan import RunPlan, build_plan, check_critic_layout
from verl_mp.planner import check_run_fits, choose_for_run
from verl_mp.reward.manager import RewardManager
from verl_mp.reward.registry import check_reward_sources
from verl_mp.reward.reward_model import check_reward_model
from verl_mp.reward.worker_proc import reward_limits
from verl_mp.rollout.multi_turn import check_tools
from verl_mp.rollout.sglang_compat import check_rollout_backend
from verl_mp.trainer.config_check import config_checks
from verl_mp.utils.errors import ErrorCollector
from verl_mp.utils.launch import warn_oversubscribed

@dataclass
class RunInputs:
    tokenizer: Any
    train: Any
    """PromptDataset of data.train_files."""
    val: Any | None
    sampler: Any
    """ResumableBatchSampler over ``train``."""
    reward: Any | None
    """RewardManager (only where rewards are scored: the driver / rank 0). It combines
    rule rewards with reward-model scores, which the workers compute."""
    pad_token_id: int


def build_inputs(cfg: RootConfig, score_rewards: bool) -> RunInputs:
    tokenizer = load_tokenizer(cfg.model.path)
    kwargs = dict(tokenizer=tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                  prompt_key=cfg.data.prompt_key, skip_bad_rows=cfg.data.skip_bad_rows)
    train = PromptDataset(cfg.data.train_files, setting="data.train_files", **kwargs)
    val = PromptDataset(cfg.data.val_files, setting="data.val_files", **kwargs) if cfg.data.val_files else None
    sampler = ResumableBatchSampler(len(train), cfg.data.train_batch_size, seed=cfg.data.seed,
                                    shuffle=cfg.data.shuffle)
    reward = None
    if score_rewards:
        rm = cfg.reward_model
        combine = rm.combine if rm.enable else "add"
        reward = RewardManager(fn_by_source=cfg.reward.fn_by_source, default_fn=cfg.reward.default_fn,
                               timeout_s=cfg.reward.timeout_s, num_workers=cfg.reward.num_workers,
                               model_combine=combine, model_coef=rm.coef, limits=reward_limits(cfg.reward),
                               max_calls_per_worker=cfg.reward.max_calls_per_worker,
                               pass_env=cfg.reward.pass_env,
                               max_failure_fraction=cfg.reward.max_failure_fraction)
        if combine == "add":  # rule functions run
            reward.check_sources(train.data_sources | (val.data_sources if val else set()))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return RunInputs(tokenizer, train, val, sampler, reward, int(pad))


def preflight(cfg: RootConfig) -> RunPlan:
    """Every check that can fail before processes start (names, files, layouts, batch sizes,
    data, lengths), each mistake reported (`ConfigErrors`: all at once, as far as the checks do
    not depend on each other); returns the run's plan (`verl_mp.plan`). The checks live in the
    layers that own their settings; this is the order they run in."""
    errors = ErrorCollector()
    warn_oversubscribed(cfg.trainer.nproc)
    placement = config_checks(cfg, errors)
    missing = path_errors(cfg)
    errors.messages += missing
    spec = errors.run(spec_from_model_dir, cfg.model.path) if model_dir_exists(cfg) else None
    if spec is None or placement is None:
        errors.raise_if_any()
    # where the ranks will run: here (with or without CUDA), or elsewhere under Ray with RAY_ADDRESS
    cuda, ray_cluster = torch.cuda.is_available(), bool(os.environ.get("RAY_ADDRESS"))
    cpu_ranks_here, cuda_ranks_here = not cuda and not ray_cluster, cuda and not ray_cluster
    dp = errors.run(validate_layout, cfg.actor.megatron, cfg.trainer.world_size, spec.shape, prefix="actor.megatron.")
    errors.run(validate_rollout_layout, cfg.rollout, placement.pool_size("rollout"), spec.num_query_groups)
    errors.run(check_moe, cfg, spec, placement, cpu_ranks_here)
    errors.run(check_rollout_model, cfg, spec, cpu_ranks_here, cuda_ranks_here)
    errors.run(check_rollout_backend, cfg.rollout.backend, None if ray_cluster and not cuda else cuda)
    if dp is not None:
        errors.run(check_batch_sizes, cfg, dp)
    errors.run(check_critic_layout, cfg, placement, spec)
    errors.run(check_max_model_len, cfg, spec)
    errors.run(check_multi_turn, cfg)
    tokenizer = errors.run(load_tokenizer, cfg.model.path)
    if cfg.rollout.multi_turn.enable:
        errors.run(check_tools, cfg.rollout.multi_turn, tokenizer)
    if tokenizer is not None:
        errors.run(check_vocab, tokenizer, cfg.model.path, spec.vocab_size)
        if not missing:
            _read_data(cfg, tokenizer, errors)
    errors.run(check_reward_model, cfg.reward_model)
    errors.raise_if_any()
    cfg = choose_for_run(cfg, spec)
    check_run_fits(cfg, spec)
    return build_plan(cfg, placement)


def _read_data(cfg: RootConfig, tokenizer, errors: ErrorCollector) -> None:
    """Read every data file as the run will (format by content, columns, rows, prompt lengths)
    and check that a reward function serves each of its data sources, into ``errors``."""
    for key in ("train_files", "val_files"):
        files = getattr(cfg.data, key)
        if files:
            data = errors.run(PromptDataset, files, tokenizer, cfg.data.max_prompt_length,
                              prompt_key=cfg.data.prompt_key, skip_bad_rows=cfg.data.skip_bad_rows,
                              setting=f"data.{key}")
            if data is not None:
                errors.run(check_reward_sources, cfg.reward, cfg.reward_model, data.data_sources, f"data.{key}")
