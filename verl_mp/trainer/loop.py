"""The RL driver loop: one call per phase, the same code for Ray and torchrun.

``workers`` is a `WorkerGroups` (`verl_mp.workers.groups`): under Ray it fans each phase
out to the Ray worker groups hosting its roles (the driver is a separate process); under
torchrun every rank runs this loop over its own `RankWorker` (data loading is
deterministic on every rank, rank 0 scores rewards and broadcasts them, rank 0 logs).
What a step runs follows from the `RunPlan`: a reference forward when a KL term needs it,
a critic when the advantage estimator asks for values, a greedy baseline generation when
it asks for one (ReMax).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from verl_mp.algo import estimator_spec
from verl_mp.config.loader import to_yaml
from verl_mp.config.schema import RootConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.rl_batch import RLBatch
from verl_mp.plan import RunPlan
from verl_mp.reward.manager import token_level_rewards
from verl_mp.rollout.types import RolloutOutput
from verl_mp.trainer import steps
from verl_mp.trainer.checkpoint_manager import CheckpointManager
from verl_mp.trainer.dynamic_sampling import ScoredSamples, fill_groups
from verl_mp.trainer.pool_clock import PoolClock
from verl_mp.trainer.resume_check import (
    DATA_FINGERPRINT_KEY,
    FINGERPRINT_KEY,
    check_resume,
    data_fingerprint,
    model_fingerprint,
)
from verl_mp.trainer.rollout_source import Generation, RolloutSource
from verl_mp.trainer.setup import RunInputs
from verl_mp.trainer.tracking import Progress, StepTimer, Tracker, console_logger
from verl_mp.utils.fs import disk_full_error
from verl_mp.workers.protocol import ForwardRequest, ForwardResult, UpdateRequest

logger = logging.getLogger(__name__)

ROUTING_FILE = "rollout_routing.safetensors"
"""Beside trainer_state.json: the routed experts of the generations in flight (`RolloutSource`)."""


class RLTrainer:
    def __init__(self, cfg: RootConfig, plan: RunPlan, inputs: RunInputs, workers, *, rank: int = 0,
                 broadcast: Callable[[Any], Any] = lambda x: x, barrier: Callable[[], None] | None = None,
                 on_phase: Callable[[str, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None):
        """``on_phase(phase, step)``: told when a phase starts (torchrun ranks record it, so
        that a failure can be reported with the phase it happened in). ``should_stop()``:
        asked after every step (the same answer on every rank); True saves (unless
        ``trainer.save_on_interrupt=false``) and ends the run there."""
        self.cfg, self.plan, self.inputs, self.workers = cfg, plan, inputs, workers
        self.rank, self.broadcast = rank, broadcast
        self.is_main = rank == 0
        self.on_phase = on_phase or (lambda phase, step: None)
        self.should_stop = should_stop or (lambda: False)
        out_dir = cfg.trainer.default_local_dir
        self.tracker: Tracker | None = None
        """Opened by `fit` once it knows the step it starts from."""
        self.ckpt = CheckpointManager(os.path.join(out_dir, "checkpoints"), cfg.trainer.max_ckpt_to_keep,
                                      rank=rank, world_barrier=barrier)
        self.kl_ctrl = steps.make_kl_controller(cfg.algorithm)
        self.spec = estimator_spec(cfg.algorithm.adv_estimator)
        self.forward_request = ForwardRequest(old_log_probs=not plan.old_log_probs_in_update,
                                              ref_log_probs=plan.ref is not None, values=plan.critic is not None)
        self.update_request = UpdateRequest(critic=plan.critic is not None)
        self.timer = StepTimer()
        self.clock = PoolClock(colocated=not plan.rollout_apart)
        mt = cfg.rollout.multi_turn
        carry = mt.enable and mt.carry_over
        self.source = RolloutSource(workers, inputs.train, inputs.sampler, self._sampling,
                                    ahead=cfg.trainer.off_policy_steps,
                                    record_routing=cfg.actor.router_replay == "rollout",
                                    carry_take=cfg.data.train_batch_size if carry else 0,
                                    carry_pool=math.ceil(cfg.data.train_batch_size * mt.carry_pool) if carry else 0,
                                    carry_max_cuts=mt.carry_max_steps)
        self.step_no, self.phase_name = 0, "start-up"
        described = workers.describe()
        self.source.routing_model = described["actor_rollout_ref"].get("routing")
        self.flop_params = described["actor_rollout_ref"]["flop_params"]
        self.world_size = sum(d["world_size"] for name, d in described.items() if name != "reward_model")
        if self.is_main:
            _write_json(os.path.join(out_dir, "workers.json"), described)

    # -- the loop --------------------------------------------------------------------------
    def fit(self) -> dict[str, float]:
        start = self.resume()
        t = self.cfg.trainer
        self.tracker = Tracker(t.logger, t.default_local_dir, t.project_name, t.experiment_name,
                               config=to_yaml(self.cfg), rank=self.rank, start_step=start)
        total = self.cfg.trainer.total_steps
        last: dict[str, float] = {}
        if self.cfg.trainer.val_before_train and start == 0 and self.cfg.trainer.test_freq:
            self.tracker.log(self.validate(), step=0)
        limit = self.cfg.trainer.max_steps_this_run
        end = total if limit is None else min(total, start + limit)
        self._end = end
        unprofiled = [s for s in t.profile.steps if not start < s <= end]
        if unprofiled and self.rank == 0:
            logger.warning("trainer.profile.steps %s are outside the steps this run trains (%d..%d): not profiled",
                           unprofiled, start + 1, end)
        with Progress(total, initial=start, rank=self.rank) as bar:
            for step in range(start + 1, end + 1):
                last = self.profiled_step(step) if step in t.profile.steps else self.step(step)
                if self.cfg.trainer.test_freq and (step % self.cfg.trainer.test_freq == 0 or step == total):
                    last.update(self.validate())
                # Logged before the save: a resumed run drops what follows its checkpoint.
                self.tracker.log(last, step=step)
                stop = self.should_stop()
                if self._should_save(step) or (stop and self.cfg.trainer.save_on_interrupt):
                    self.save(step)
                bar.update(last)
                if stop:
                    logger.warning("stopping after step %d as asked (signal); resume_mode=auto continues", step)
                    break
        if self.cfg.trainer.export_hf_at_end and end == total:
            self.workers.export_hf(os.path.join(self.cfg.trainer.default_local_dir, "hf"))
        self.tracker.close()
        return last

    def profiled_step(self, step: int) -> dict[str, float]:
        """`step` under torch.profiler on the ranks `trainer.profile` names; the files go to
        ``<default_local_dir>/profile/step_<N>/`` (`verl_mp.utils.profiling`)."""
        directory = os.path.join(self.cfg.trainer.default_local_dir, "profile", f"step_{step}")
        self.workers.start_profile(directory, self.cfg.trainer.profile)
        metrics = self.step(step)
        for group, summary in self.workers.stop_profile().items():
            if summary is not None and self.rank == 0:
                phases = ", ".join(f"{p} {v['cpu_ms']:.0f} ms" for p, v in summary["phases"].items())
                kinds = ", ".join(f"{k} {ms:.0f} ms" for k, ms in summary["device_ms_by_kind"].items())
                logger.info("step %d profiled (%s rank 0, files in %s): phases %s; kernels %s", step, group,
                            directory, phases, kinds or "none (CPU)")
        return metrics

    def step(self, step: int) -> dict[str, float]:
        """One RL step: generate (or take what was generated ahead) -> reward (and dynamic
        sampling) -> forward (old/ref log-probs, values) -> rollout correction ->
        advantages -> update (critic, actor) -> weight sync."""
        cfg, metrics = self.cfg, {"training/step": float(step)}
        self.step_no = step
        self.timer.reset()
        self.workers.step_counters()
        window_start = time.time()
        with self._phase("generate"):
            gen = self.source.take(step)
        self.clock.generation(gen.out.wall_start, gen.out.wall_end)
        samples, filter_metrics = self._samples(step, gen)
        # Off-policy: the next steps generate while this one trains (up to the run's last step,
        # not this invocation's: a checkpoint then holds what an uninterrupted run would have).
        self.source.prefetch(step, cfg.trainer.total_steps)
        batch = self._batch(samples)
        metrics.update(samples.out.metrics, **samples.reward_metrics, **filter_metrics)
        fresh = batch.weight_versions == step - 1  # on-policy samples: the gap measures the sync
        # the old log-probs come from the update (the plan's choice) only for a batch of fresh samples: older ones
        # (a resume from a run with off-policy steps) need their pass
        request = self.forward_request if bool(fresh.all()) else replace(self.forward_request, old_log_probs=True)
        fwd = ForwardResult()
        if request.roles():
            with self._phase("forward"):
                fwd = self.workers.forward(batch, request)
        batch.old_log_probs, batch.ref_log_probs, batch.values = fwd.old_log_probs, fwd.ref_log_probs, fwd.values
        if fwd.routed_experts is not None:  # actor.router_replay=old_logprob: the update replays it
            batch.routed_experts = fwd.routed_experts
        metrics.update(fwd.metrics)
        gap = steps.logprob_gap_metrics(batch, fresh) if batch.old_log_probs is not None else {}
        steps.check_logprob_gap(gap, cfg.rollout.logprob_diff_threshold, step)
        metrics.update(steps.staleness_metrics(batch, step))
        metrics.update(steps.apply_rollout_correction(batch, cfg.algorithm.rollout_correction))
        metrics.update(steps.compute_rewards(batch, cfg.algorithm, self.kl_ctrl))
        baseline = self._greedy_baseline(samples.prompts) if self.spec.needs_greedy_baseline else None
        with self._phase("adv"):
            steps.compute_advantages(batch, cfg.algorithm, baseline)
        with self._phase("update"):
            metrics.update(self.workers.update(batch, self.update_request))
        if batch.old_log_probs is None:  # no old-log-prob pass: the update's forward pass measured the gap
            gap = steps.gap_from_update(metrics)
        steps.check_finite({k: v for k, v in metrics.items() if k.endswith(("pg_loss", "vf_loss", "grad_norm"))},
                           "update", hint="the losses or gradient norms of the update")
        with self._phase("weight_sync"):
            metrics.update(self.workers.sync_weights())
        self.source.synced(step)
        metrics.update(gap, **steps.response_metrics(batch, samples.out), **steps.advantage_metrics(batch),
                       **steps.signal_metrics(batch, step))
        return {**metrics, **self._speed_metrics(batch, samples.out, window_start)}

    def _speed_metrics(self, batch: RLBatch, out: RolloutOutput, window_start: float) -> dict[str, float]:
        """Round trips, phase times, each pool's idle time and overlap, throughput, FLOPs."""
        for pending in self.source.finished_outputs():  # done: the sync queued behind them
            self.clock.generation(pending.wall_start, pending.wall_end)
        metrics = {**self.workers.step_counters(), **self.timer.metrics(),
                   **self.clock.step_metrics((window_start, time.time()))}
        metrics["perf/tokens_per_s"] = steps.tokens_in(batch) / max(metrics["timing/step_s"], 1e-9)
        # multi-turn: the model's tokens, not the tool responses'; with carry-over the tokens this
        # generation sampled (its cut conversations' included, the earlier ones of those it completed not)
        generated = out.num_generated_tokens
        if self.source.carry_take and "rollout/multi_turn/model_tokens" in out.metrics:
            generated = out.metrics["rollout/multi_turn/model_tokens"]
        metrics["timing/generate_tokens_per_s"] = generated / max(out.wall_end - out.wall_start, 1e-9)
        if out.metrics.get("timing/generate_engine_s"):  # the engine call alone (no wake or sleep)
            metrics["timing/generate_engine_tokens_per_s"] = generated / out.metrics["timing/generate_engine_s"]
        metrics.update(self._flops(batch, metrics["timing/step_s"]))
        return metrics

    def _samples(self, step: int, gen: Generation) -> tuple[ScoredSamples, dict[str, float]]:
        """The step's scored samples; with data.filter_groups, groups of equal rewards are
        dropped and refilled by further rounds of new prompts (`dynamic_sampling`)."""
        with self._phase("reward"):
            first = self._scored(gen)
        fg = self.cfg.data.filter_groups
        if not fg.enable:
            return first, {}

        def next_round(round_no: int) -> ScoredSamples:
            with self._phase("generate"):
                more = self.source.generate_now(step, round_no)
            self.clock.generation(more.out.wall_start, more.out.wall_end)
            with self._phase("reward"):
                return self._scored(more)

        return fill_groups(first, next_round, self.cfg.data.train_batch_size, fg.max_extra_rounds)

    def _scored(self, gen: Generation) -> ScoredSamples:
        scores, reward_metrics = self._score(gen.prompts, gen.out)
        return ScoredSamples(gen.prompts, gen.out, scores, gen.sample_versions(), reward_metrics)

    def _batch(self, samples: ScoredSamples) -> RLBatch:
        batch = steps.build_batch(samples.prompts, samples.out, self.inputs.pad_token_id)
        batch.token_level_scores = token_level_rewards(samples.scores, batch.response_mask)
        batch.weight_versions = samples.versions
        return batch

    @contextmanager
    def _phase(self, name: str):
        self.phase_name = name
        self.on_phase(name, self.step_no)
        start = time.time()
        with self.timer.phase(name):
            yield
        self.clock.phase(name, start, time.time())

    def _flops(self, batch: RLBatch, seconds: float) -> dict[str, float]:
        cfg = self.cfg
        forward = sum(x is not None for x in (batch.old_log_probs, batch.ref_log_probs, batch.values))  # passes run
        train = cfg.actor.ppo_epochs + (cfg.critic.ppo_epochs if self.update_request.critic else 0)
        return steps.flops_metrics(batch, seconds, self.flop_params, self.world_size, forward, train,
                                   cfg.trainer.peak_tflops)

    # -- phases ------------------------------------------------------------------------------
    def _sampling(self, step: int, round_no: int = 0):
        # Seeds derive from (trainer.seed, step, round) so that a resumed run samples exactly
        # what the uninterrupted run would have. Log-probs only on the steps that use them:
        # every step with a rollout correction, and with carry-over (a conversation cut now is
        # trained later, with the log-probs of every generation it went through).
        freq = self.cfg.rollout.logprob_gap_freq
        gap = bool(freq) and (step % freq == 0 or step == 1)
        seed = self.cfg.trainer.seed * 1_000_003 + step * 10_007 + round_no * 101
        mt = self.cfg.rollout.multi_turn
        return replace(self.cfg.rollout.sampling, seed=seed,
                       logprobs=gap or self.cfg.algorithm.rollout_correction.enabled or (mt.enable and mt.carry_over))

    def _score(self, prompts: PromptBatch, out: RolloutOutput) -> tuple[torch.Tensor, dict[str, float]]:
        """``[B]`` sequence rewards of ``out``'s samples (rank 0 scores, every rank gets them)."""
        # multi-turn: the answer is the last assistant turn, and the reward function may read the
        # whole trajectory (turns, tool calls, tool responses)
        texts = out.final_texts() or self.inputs.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        groups = [i // out.n for i in range(len(texts))]
        model_scores, result = None, None
        if self.plan.has("reward_model"):  # the reward model reads chat-templated prompt + response
            model_scores = self.workers.score([prompts.prompts[g] + text for g, text
                                               in zip(groups, steps.reward_model_texts(out, texts, self.inputs.tokenizer),
                                                      strict=True)])
        if self.is_main:
            result = self.inputs.reward.score(texts, [prompts.ground_truths[g] for g in groups],
                                              [prompts.data_sources[g] for g in groups], model_scores=model_scores,
                                              trajectories=out.trajectories)
            result = (result.scores, result.metrics)
        scores, reward_metrics = self.broadcast(result)
        return scores.float(), reward_metrics

    def _greedy_baseline(self, prompts: PromptBatch) -> torch.Tensor:
        """[B] rewards of one greedy response per prompt, repeated over its samples (ReMax)."""
        with self._phase("baseline"):
            greedy = replace(self.cfg.rollout.val_sampling, n=1, temperature=0.0)
            scores, _ = self._score(prompts, self.workers.generate(prompts.input_ids, greedy))
        return scores.repeat_interleave(self.cfg.rollout.sampling.n)

    def validate(self) -> dict[str, float]:
        if self.inputs.val is None:
            return {}
        val = self.inputs.val
        prompts = val.get_batch(list(range(min(len(val), self.cfg.data.val_batch_size))))
        out = self.workers.generate(prompts.input_ids, self.cfg.rollout.val_sampling)
        scores, reward_metrics = self._score(prompts, out)
        return {"val/score/mean": scores.mean().item(),
                "val/accuracy": reward_metrics.get("reward/accuracy", (scores > 0).float().mean().item()),
                "val/response_length/mean": sum(len(r) for r in out.response_ids) / max(len(out.response_ids), 1),
                **steps.validation_turn_metrics(out.metrics)}

    # -- checkpoints -------------------------------------------------------------------------
    def _should_save(self, step: int) -> bool:
        t = self.cfg.trainer
        last_of_run = step == t.total_steps or (t.max_steps_this_run is not None and step == self._end)
        return bool(t.save_freq and step % t.save_freq == 0) or (t.save_final and last_of_run)

    def save(self, step: int) -> None:
        """A checkpoint of step ``step``, published atomically: if anything fails (a full
        disk), the previous checkpoints stay as they were and nothing looks complete."""
        staging = self.ckpt.staging_dir(step)
        try:
            with self._phase("save"):
                self.workers.save_checkpoint(staging)
                if self.is_main:
                    state = {"sampler": self.inputs.sampler.state_dict(), "kl_coef": self.kl_ctrl.value,
                             "step": step, FINGERPRINT_KEY: model_fingerprint(self.cfg.model.path),
                             DATA_FINGERPRINT_KEY: data_fingerprint(self.cfg.data.train_files),
                             "rollout_source": self.source.state_dict()}
                    with open(os.path.join(staging, "trainer_state.json"), "w") as f:
                        json.dump(state, f)
                    routing = self.source.routing_state()
                    if routing:  # the in-flight generations' routed experts (router_replay=rollout)
                        save_file(routing, os.path.join(staging, ROUTING_FILE))
                    with open(os.path.join(staging, "config.yaml"), "w") as f:
                        f.write(to_yaml(self.cfg))
                _fault_injection_delay(step)
                self.ckpt.commit(step)
        except BaseException as err:  # noqa: BLE001  (re-raised unless the disk is full)
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            full = disk_full_error(err)
            short = None if full is not None else self.ckpt.short_of_space()
            if full is None and short is None:
                raise
            code = full.errno if full is not None else errno.ENOSPC
            why = os.strerror(code) if short is None else \
                f"{os.strerror(code)}: {short}; the writer failed with {_one_line(err)}"
            latest = self.ckpt.latest()
            kept = f"the last complete checkpoint, {latest[1]}, is intact" if latest else "no checkpoint was complete"
            raise CheckpointWriteError(
                code, f"the checkpoint of step {step} could not be written under {self.ckpt.root} ({why}); {kept}. "
                "Free space (or lower trainer.max_ckpt_to_keep) and run again: trainer.resume_mode=auto continues "
                "from it") from err

    def resume(self) -> int:
        found = self.ckpt.resolve_resume(self.cfg.trainer.resume_mode)
        if found is None:
            return 0
        step, path = found
        # A checkpoint of another run (an old output dir) must not be continued silently.
        check_resume(path, self.cfg, explicit=self.cfg.trainer.resume_mode != "auto")
        # on the console too (rank 0's: the progress logger), not only in the logs
        (console_logger if self.rank == 0 else logger).info("resuming from %s (step %d)", path, step)
        self.workers.load_checkpoint(path)
        with open(os.path.join(path, "trainer_state.json")) as f:
            state = json.load(f)
        self.inputs.sampler.load_state_dict(state["sampler"])
        self.kl_ctrl.value = state["kl_coef"]
        # What was generated ahead (off-policy) is trained as it was; checkpoints written
        # before it was recorded had nothing in flight.
        routing_file = os.path.join(path, ROUTING_FILE)
        routing = load_file(routing_file) if os.path.exists(routing_file) else None
        self.source.load_state_dict(state.get("rollout_source", {"version": step, "pending": []}), routing)
        # The rollout engine still holds the initial weights: never sample from them.
        self.workers.sync_weights()
        self.source.synced(step)
        return step


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written for lack of space; the message says which complete
    checkpoint is intact and how to continue from it."""


def _write_json(path: str, obj) -> None:
    from dataclasses import asdict, is_dataclass

    def plain(o):
        if is_dataclass(o):
            return asdict(o)
        raise TypeError(type(o).__name__)

    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=plain)


def _fault_injection_delay(step: int) -> None:
    """``VERL_MP_CKPT_COMMIT_DELAY_S``: wait before publishing a checkpoint, so that tests
    can kill the trainer deterministically while a checkpoint is half written: ``30`` before
    every checkpoint, ``30@2`` before step 2's only (the checkpoints before it are published
    at once)."""
    value, _, at = (os.environ.get("VERL_MP_CKPT_COMMIT_DELAY_S", "") or "0").partition("@")
    delay = float(value)
    if delay > 0 and (not at or int(at) == step):
        import time

        time.sleep(delay)
