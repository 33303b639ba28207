"""The RL driver loop: one call per phase, the same code for Ray and torchrun.

``workers`` is either the Ray `RoleRouter` over the worker groups (the driver is a separate
process; each role's calls go to the group hosting it, see ``trainer.placement``) or the
local hybrid worker (torchrun SPMD: every rank runs this loop; data loading is
deterministic on every rank, rank 0 scores rewards and broadcasts them, rank 0 logs).
A reward model, when enabled, is a worker call (collective in SPMD) made before rank 0
combines its scores with the rule rewards.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from verl_mp.config.loader import to_yaml
from verl_mp.config.schema import RootConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.rl_batch import RLBatch
from verl_mp.trainer import steps
from verl_mp.trainer.checkpoint_manager import CheckpointManager
from verl_mp.trainer.resume_check import FINGERPRINT_KEY, check_resume, model_fingerprint
from verl_mp.trainer.setup import RunInputs
from verl_mp.trainer.tracking import Progress, StepTimer, Tracker

logger = logging.getLogger(__name__)


class RLTrainer:
    def __init__(self, cfg: RootConfig, inputs: RunInputs, workers, *, rank: int = 0,
                 broadcast: Callable[[Any], Any] = lambda x: x, barrier: Callable[[], None] | None = None):
        self.cfg, self.inputs, self.workers = cfg, inputs, workers
        self.rank, self.broadcast = rank, broadcast
        self.is_main = rank == 0
        out_dir = cfg.trainer.default_local_dir
        self.tracker = Tracker(cfg.trainer.logger, out_dir, cfg.trainer.project_name,
                               cfg.trainer.experiment_name, config=to_yaml(cfg), rank=rank)
        self.ckpt = CheckpointManager(os.path.join(out_dir, "checkpoints"), cfg.trainer.max_ckpt_to_keep,
                                      rank=rank, world_barrier=barrier)
        self.kl_ctrl = steps.make_kl_controller(cfg.algorithm)
        self.use_critic = steps.needs_critic(cfg)
        self.use_ref = steps.needs_reference(cfg)
        self.model_info = workers.model_info()

    # -- the loop --------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        start = self.resume()
        total = self.cfg.trainer.total_steps
        last: dict[str, float] = {}
        if self.cfg.trainer.val_before_train and start == 0 and self.cfg.trainer.test_freq:
            self.tracker.log(self.validate(), step=0)
        limit = self.cfg.trainer.max_steps_this_run
        end = total if limit is None else min(total, start + limit)
        self._end = end
        with Progress(total, initial=start, rank=self.rank) as bar:
            for step in range(start + 1, end + 1):
                last = self.train_step(step)
                if self.cfg.trainer.test_freq and (step % self.cfg.trainer.test_freq == 0 or step == total):
                    last.update(self.validate())
                if self._should_save(step):
                    self.save(step)
                self.tracker.log(last, step=step)
                bar.update(last)
        if self.cfg.trainer.export_hf_at_end and end == total:
            self.workers.export_hf(os.path.join(self.cfg.trainer.default_local_dir, "hf"))
        self.tracker.close()
        return last

    def train_step(self, step: int) -> dict[str, float]:
        cfg, timer, metrics = self.cfg, StepTimer(), {"training/step": float(step)}
        prompts = self.inputs.train.get_batch(self.inputs.sampler.next_batch())
        with timer.phase("generate"):
            out = self.workers.generate(prompts.input_ids, self._sampling(step))
        batch = steps.build_batch(prompts, out, self.inputs.pad_token_id)
        with timer.phase("reward"):
            metrics.update(self._score(batch, prompts, out.response_ids))
        with timer.phase("old_log_prob"):
            batch.old_log_probs = self.workers.compute_log_probs(batch, "actor")
        gap = steps.logprob_gap_metrics(batch)
        steps.check_logprob_gap(gap, cfg.rollout.logprob_diff_threshold, step)
        if self.use_ref:
            with timer.phase("ref"):
                batch.ref_log_probs = self.workers.compute_log_probs(batch, "ref")
        if self.use_critic:
            with timer.phase("values"):
                batch.values = self.workers.compute_values(batch)
        metrics.update(steps.compute_rewards(batch, cfg.algorithm, self.kl_ctrl))
        with timer.phase("adv"):
            steps.compute_advantages(batch, cfg.algorithm, self._remax_baseline(prompts, step))
        if self.use_critic:
            with timer.phase("update_critic"):
                metrics.update(self.workers.update_critic(batch))
        with timer.phase("update_actor"):
            metrics.update(self.workers.update_actor(batch))
        with timer.phase("weight_sync"):
            metrics.update(self.workers.sync_weights())
        metrics.update(gap, **steps.response_metrics(batch, out), **steps.advantage_metrics(batch))
        metrics.update(timer.metrics())
        metrics["perf/tokens_per_s"] = steps.tokens_in(batch) / max(metrics["timing/step_s"], 1e-9)
        metrics["timing/generate_tokens_per_s"] = out.num_tokens / max(metrics["timing/generate_s"], 1e-9)
        metrics.update(self._flops(batch, metrics["timing/step_s"]))
        return metrics

    def _flops(self, batch: RLBatch, seconds: float) -> dict[str, float]:
        cfg = self.cfg
        forward = 1 + int(self.use_ref) + int(self.use_critic)
        train = cfg.actor.ppo_epochs + (cfg.critic.ppo_epochs if self.use_critic else 0)
        return steps.flops_metrics(batch, seconds, self.model_info["flop_params"], self.model_info["world_size"],
                                   forward, train, cfg.trainer.peak_tflops)

    # -- phases ------------------------------------------------------------------------------
    def _sampling(self, step: int):
        # Seeds derive from (trainer.seed, step) so that a resumed run samples exactly
        # what the uninterrupted run would have.
        return replace(self.cfg.rollout.sampling, seed=self.cfg.trainer.seed * 1_000_003 + step * 10_007)

    def _score(self, batch: RLBatch, prompts: PromptBatch, response_ids: list[list[int]]) -> dict[str, float]:
        texts = self.inputs.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        model_scores, result = None, None
        if self.cfg.reward_model.enable:  # the reward model reads chat-templated prompt + response
            model_scores = self.workers.score_sequences(
                [prompts.prompts[int(g)] + text for g, text in zip(batch.group_ids, texts, strict=True)])
        if self.is_main:
            result = self.inputs.reward.score(texts, batch.ground_truths, batch.data_sources,
                                              model_scores=model_scores)
            result = (result.scores, result.metrics)
        scores, reward_metrics = self.broadcast(result)
        from verl_mp.reward.manager import token_level_rewards

        batch.token_level_scores = token_level_rewards(scores, batch.response_mask)
        return reward_metrics

    def _remax_baseline(self, prompts, step: int) -> torch.Tensor | None:
        if self.cfg.algorithm.adv_estimator != "remax":
            return None
        greedy = replace(self.cfg.rollout.val_sampling, n=1, temperature=0.0)
        out = self.workers.generate(prompts.input_ids, greedy)
        base = steps.build_batch(prompts, out, self.inputs.pad_token_id)
        self._score(base, prompts, out.response_ids)
        return (base.token_level_scores.sum(-1)).repeat_interleave(self.cfg.rollout.sampling.n)

    def validate(self) -> dict[str, float]:
        if self.inputs.val is None:
            return {}
        val = self.inputs.val
        prompts = val.get_batch(list(range(min(len(val), self.cfg.data.val_batch_size))))
        out = self.workers.generate(prompts.input_ids, self.cfg.rollout.val_sampling)
        batch = steps.build_batch(prompts, out, self.inputs.pad_token_id)
        reward_metrics = self._score(batch, prompts, out.response_ids)
        scores = (batch.token_level_scores).sum(-1)
        metrics = {"val/score/mean": scores.mean().item(),
                   "val/accuracy": reward_metrics.get("reward/accuracy", (scores > 0).float().mean().item()),
                   "val/response_length/mean": batch.response_lengths.float().mean().item()}
        return metrics

    # -- checkpoints -------------------------------------------------------------------------
    def _should_save(self, step: int) -> bool:
        t = self.cfg.trainer
        last_of_run = step == t.total_steps or (t.max_steps_this_run is not None and step == self._end)
        return bool(t.save_freq and step % t.save_freq == 0) or (t.save_final and last_of_run)

    def save(self, step: int) -> None:
        staging = self.ckpt.staging_dir(step)
        self.workers.save_checkpoint(staging)
        if self.is_main:
            state = {"sampler": self.inputs.sampler.state_dict(), "kl_coef": self.kl_ctrl.value, "step": step,
                     FINGERPRINT_KEY: model_fingerprint(self.cfg.model.path)}
            with open(os.path.join(staging, "trainer_state.json"), "w") as f:
                json.dump(state, f)
            with open(os.path.join(staging, "config.yaml"), "w") as f:
                f.write(to_yaml(self.cfg))
        _fault_injection_delay()
        self.ckpt.commit(step)

    def resume(self) -> int:
        found = self.ckpt.resolve_resume(self.cfg.trainer.resume_mode)
        if found is None:
            return 0
        step, path = found
        # A checkpoint of another run (an old output dir) must not be continued silently.
        check_resume(path, self.cfg, explicit=self.cfg.trainer.resume_mode != "auto")
        logger.info("resuming from %s (step %d)", path, step)
        self.workers.load_checkpoint(path)
        with open(os.path.join(path, "trainer_state.json")) as f:
            state = json.load(f)
        self.inputs.sampler.load_state_dict(state["sampler"])
        self.kl_ctrl.value = state["kl_coef"]
        # The rollout engine still holds the initial weights: never sample from them.
        self.workers.sync_weights()
        return step


def _fault_injection_delay() -> None:
    """``VERL_MP_CKPT_COMMIT_DELAY_S``: wait before publishing a checkpoint, so that tests
    can kill the trainer deterministically while a checkpoint is half written."""
    delay = float(os.environ.get("VERL_MP_CKPT_COMMIT_DELAY_S", "0") or 0)
    if delay > 0:
        import time

        time.sleep(delay)
