"""The real CLI for a few steps on CPU: Megatron TP=2 + vLLM TP=2 on gloo, Ray and torchrun."""

import json
import math

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e

REQUIRED = [
    "reward/score/mean", "reward/score/std", "reward/score/max", "reward/accuracy",
    "response_length/mean", "response_length/max", "response_length/clip_ratio",
    "actor/pg_loss", "actor/clipfrac", "actor/approx_kl", "actor/grad_norm", "actor/lr",
    "rollout/logprob_diff_max", "rollout/logprob_diff_mean", "rollout/sync_bytes",
    "timing/generate_s", "timing/weight_sync_s", "timing/update_actor_s", "timing/step_s",
    "perf/tokens_per_s", "timing/generate_tokens_per_s", "perf/tflops_per_s", "perf/mfu",
    # the generate and sync phases split into parts (vLLM alone is compared with the engine part)
    "timing/generate_free_s", "timing/generate_wake_s", "timing/generate_engine_s", "timing/generate_sleep_s",
    "timing/generate_onload_s", "timing/generate_engine_gc_s", "perf/generate_engine_gc_full_collections",
    "timing/generate_engine_tokens_per_s",
    "timing/weight_sync_wake_s", "timing/weight_sync_load_s",
]


def _steps(out_dir):
    return {r["step"]: r for r in read_jsonl(str(out_dir / "metrics.jsonl"))}


@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_grpo(tiny_run_inputs, tmp_path, launcher):
    out = tmp_path / launcher
    proc = run_cli(["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, launcher),
                    "actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
                    "actor.kl_loss_coef=0.0123", "actor.entropy_coeff=0.001", "trainer.peak_tflops=0.1",
                    "trainer.profile.steps=[2]"])
    # quiet by default: a step line each, warnings, the run's start and end (the rest is in logs/)
    printed = (proc.stdout + proc.stderr).splitlines()
    assert len(printed) <= 60, "\n".join(printed)
    assert (out / "logs" / "driver.log").stat().st_size > 0
    steps = _steps(out)
    assert set(steps) >= {0, 1, 2}
    for key in REQUIRED + ["actor/kl_loss", "actor/entropy", "val/accuracy"]:
        assert key in steps[2] and steps[2][key] is not None, key
    for step in (1, 2):
        s = steps[step]  # the parts are inside their phase
        assert sum(s[f"timing/generate_{p}_s"] for p in ("free", "wake", "engine", "sleep", "onload")) \
            <= s["timing/generate_s"]
        assert s["timing/weight_sync_wake_s"] + s["timing/weight_sync_load_s"] <= s["timing/weight_sync_s"]
        # the rollout's log-probs equal the trainer's after every sync (fp32)
        assert steps[step]["rollout/logprob_diff_max"] < 1e-4
        # the CLI override reached the loss on every rank (max == min == value)
        assert math.isclose(steps[step]["actor/kl_loss_coef_max"], 0.0123, rel_tol=1e-6)
        assert math.isclose(steps[step]["actor/kl_loss_coef_min"], 0.0123, rel_tol=1e-6)
    assert (out / "config.yaml").read_text().count("kl_loss_coef: 0.0123") == 1
    assert (out / "checkpoints" / "global_step_2" / "meta.json").exists()
    # generate, forward (old + reference log-probs), update, weight sync; profiling step 2
    # (trainer.profile) adds none
    assert all(steps[s]["perf/driver_round_trips"] == 4 for s in (1, 2))
    # the profiled step: each phase of the step, from the worker process that ran it
    profiled = out / "profile" / "step_2"
    assert sorted(p.name for p in profiled.iterdir()) == [
        "actor_rollout_ref_rank0.trace.json.gz", "actor_rollout_ref_rank0.txt", "actor_rollout_ref_rank0_phases.json"]
    phases = json.loads((profiled / "actor_rollout_ref_rank0_phases.json").read_text())["phases"]
    assert set(phases) == {"generate", "forward", "old_log_prob", "ref", "update", "update_actor", "sync_weights"}
    assert all(p["calls"] == 1 and p["cpu_ms"] > 0 for p in phases.values())
    assert not (out / "profile" / "step_1").exists()


ENGINE_KEYS = {  # run-config key -> (role, EngineConfig field, value)
    "actor.remove_padding=true": ("actor", "remove_padding", True),
    "actor.attention_backend=sdpa": ("actor", "attention_backend", "sdpa"),
    "actor.recompute=selective": ("actor", "recompute", "selective"),
    "actor.max_tokens_per_micro_batch=96": ("actor", "max_tokens_per_micro_batch", 96),
    "actor.offload.grads=true": ("actor", "offload_grads", True),
    "actor.offload.optimizer=true": ("actor", "offload_optimizer", True),
    "ref.micro_batch_size=3": ("ref", "micro_batch_size", 3),
    "ref.offload.params=false": ("ref", "offload_params", False),
    "critic.recompute=full": ("critic", "recompute", "full"),
    "critic.attention_backend=local": ("critic", "attention_backend", "local"),
    "critic.micro_batch_size=5": ("critic", "micro_batch_size", 5),
}


def test_ppo_with_a_plugin_estimator_that_needs_values(tiny_run_inputs, tmp_path):
    """PPO with a critic that nothing but the estimator asks for (critic.enable unset), every
    engine setting set from the run config and received by the engines on the ranks, and
    at most 4 driver round trips per step."""
    out = tmp_path / "ppo"
    run_cli(["--config-name", "ppo", *base_overrides(tiny_run_inputs, out, "torchrun"),
             "actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
             "trainer.save_final=false", "trainer.peak_tflops=0.1", "critic.enable=null",
             "algorithm.adv_estimator=tests.e2e.plugins:values_baseline", "algorithm.estimator_kwargs.scale=0.5",
             *ENGINE_KEYS])
    steps = _steps(out)
    for key in REQUIRED + ["critic/vf_loss", "critic/vf_clipfrac", "critic/explained_variance",
                           "actor/reward_kl_penalty", "timing/update_critic_s", "timing/values_s"]:
        assert key in steps[2] and steps[2][key] is not None, key
    assert all(steps[s]["perf/driver_round_trips"] == 4 for s in (1, 2))
    engines = json.loads((out / "workers.json").read_text())["actor_rollout_ref"]["engines"]
    for key, (role, name, value) in ENGINE_KEYS.items():
        assert engines[role][name] == value, (key, engines[role][name])
