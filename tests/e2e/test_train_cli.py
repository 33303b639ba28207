"""The real CLI for a few steps on CPU: Megatron TP=2 + vLLM TP=2 on gloo, Ray and torchrun.

`test_grpo` (both launchers) and `test_resume_continues_exactly` are in README's fast test
command (``smoke``): the pipeline end to end once, with the rollout-vs-trainer log-prob gap
checked after every sync and an exact resume.
"""

import json
import math
import re
import shutil

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import (base_overrides, console_lines, fresh_tmpdir, left_in_tmpdir, longest_silence_s, resumed_from,
                      run_cli, run_log, steps_logged)

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


def _grpo_args(inputs, out, launcher):
    return ["--config-name", "grpo", *base_overrides(inputs, out, launcher),
            "actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
            "actor.kl_loss_coef=0.0123", "actor.entropy_coeff=0.001", "trainer.peak_tflops=0.1",
            "trainer.profile.steps=[2]", "trainer.profile.host=true", "trainer.profile.top=400",
            "trainer.save_freq=1"]


@pytest.fixture(scope="module")
def grpo_runs(tiny_run_inputs, tmp_path_factory):
    """``launcher -> (run dir, CompletedProcess)`` of a 2-step GRPO run, each run once per
    module (the resume test continues the torchrun run's step-1 checkpoint)."""
    runs = {}

    def get(launcher):
        if launcher not in runs:
            out = tmp_path_factory.mktemp("grpo") / launcher
            tmp = fresh_tmpdir()
            runs[launcher] = out, run_cli(_grpo_args(tiny_run_inputs, out, launcher), env={"TMPDIR": str(tmp)})
            runs[launcher][1].left_in_tmpdir = left_in_tmpdir(tmp)
        return runs[launcher]

    return get


@pytest.mark.smoke
@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_grpo(grpo_runs, launcher):
    out, proc = grpo_runs(launcher)
    # quiet by default: a step line each, warnings, the run's start and end (the rest is in logs/)
    printed = (proc.stdout + proc.stderr).splitlines()
    assert len(printed) <= 60, "\n".join(printed)
    assert (out / "logs" / "driver.log").stat().st_size > 0
    # every rank's full output in the run directory (Ray too: not in Ray's session dir): vLLM's lines
    assert re.search(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\] ", run_log(out)), \
        run_log(out)[-3000:]
    # the console never silent for long (start-up: a line every 15 s), each line once (a
    # warning of the SPMD loop is not repeated per rank), a short human last line
    assert longest_silence_s(proc.stderr) <= 22, proc.stderr
    timestampless = [line.split(" ", 2)[-1] for line in console_lines(proc.stderr)]
    assert len(timestampless) == len(set(timestampless)), proc.stderr
    last = console_lines(proc.stderr)[-1]
    assert re.search(r"run: done: step 2 of 2 in .*; report: .*summary\.md$", last) and len(last) < 250, last
    # nothing left in the temp dir: Ray's session dir, torchelastic_*, pymp-*
    assert not proc.left_in_tmpdir, proc.left_in_tmpdir
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
    assert (out / "checkpoints" / "global_step_1" / "meta.json").exists()
    assert (out / "checkpoints" / "global_step_2" / "meta.json").exists()
    # generate, forward (old + reference log-probs), update, weight sync; profiling step 2
    # (trainer.profile) adds none
    assert all(steps[s]["perf/driver_round_trips"] == 4 for s in (1, 2))
    # the profiled step: each phase of the step, from the worker process that ran it
    profiled = out / "profile" / "step_2"
    assert sorted(p.name for p in profiled.iterdir()) == [
        "actor_rollout_ref_rank0.trace.json.gz", "actor_rollout_ref_rank0.txt", "actor_rollout_ref_rank0_host.txt",
        "actor_rollout_ref_rank0_phases.json"]
    # trainer.profile.host: the step's Python, the in-process vLLM engine's scheduler included
    host = (profiled / "actor_rollout_ref_rank0_host.txt").read_text()
    assert "Ordered by: cumulative time" in host, host[:3000]
    assert "vllm_rollout.py" in host and "scheduler.py" in host, host[:3000]
    phases = json.loads((profiled / "actor_rollout_ref_rank0_phases.json").read_text())["phases"]
    assert set(phases) == {"generate", "forward", "old_log_prob", "ref", "update", "update_actor", "sync_weights"}
    assert all(p["calls"] == 1 and p["cpu_ms"] > 0 for p in phases.values())
    assert not (out / "profile" / "step_1").exists()


# wall-clock dependent metrics can differ between runs; everything else must not
VOLATILE = ("timing/", "perf/", "rollout/sync_gbps")


@pytest.mark.smoke
def test_resume_continues_exactly(grpo_runs, tiny_run_inputs, tmp_path):
    """A copy of the torchrun run's directory without its step-2 checkpoint, started again
    (``resume_mode=auto``): it logs that it resumes from ``global_step_1``, runs only step 2,
    keeps the rows of steps 0-1 byte for byte, and logs for step 2 exactly what the
    uninterrupted run logged (wall-clock metrics aside). Shown to fail with
    ``RLTrainer.resume`` returning 0 at once (a silent fresh start: it re-runs step 1, which
    a comparison of rows keyed by step alone would not see)."""
    original, _ = grpo_runs("torchrun")
    out = tmp_path / "resumed"
    shutil.copytree(original, out)
    shutil.rmtree(out / "checkpoints" / "global_step_2")
    rows_before = (out / "metrics.jsonl").read_text().splitlines()
    first_log = run_log(out)
    proc = run_cli(_grpo_args(tiny_run_inputs, out, "torchrun"))
    assert resumed_from(proc.stderr) == {("global_step_1", 1)}  # on the console too
    assert proc.stderr.count("resuming from ") == 1, proc.stderr  # rank 0's
    resumed = run_log(out, start=len(first_log.encode()))
    assert resumed_from(resumed) == {("global_step_1", 1)}, resumed[-3000:]
    assert steps_logged(resumed) == [2], resumed[-3000:]
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0, 1, 2]
    assert rows[:2] == rows_before[:2]  # the rows before the checkpoint, byte for byte
    want, got = _steps(original)[2], json.loads(rows[2])
    assert want.keys() == got.keys()
    for key, value in want.items():
        if not key.startswith(VOLATILE):
            assert got[key] == value, (key, value, got[key])


ENGINE_KEYS = {  # run-config key -> (role, EngineConfig field, value)
    "actor.remove_padding=true": ("actor", "remove_padding", True),
    "actor.attention_backend=sdpa": ("actor", "attention_backend", "sdpa"),
    "actor.recompute=selective": ("actor", "recompute", "selective"),
    "actor.max_tokens_per_micro_batch=96": ("actor", "max_tokens_per_micro_batch", 96),
    "actor.offload.grads=true": ("actor", "offload.grads", True),
    "actor.offload.optimizer=true": ("actor", "offload.optimizer", True),
    "ref.micro_batch_size=3": ("ref", "micro_batch_size", 3),
    "ref.offload.params=false": ("ref", "offload.params", False),
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
        got = engines[role]
        for part in name.split("."):
            got = got[part]
        assert got == value, (key, got)


def test_old_log_probs_from_the_update_pass(tiny_run_inputs, tmp_path):
    """GRPO with one optimizer step a step (`actor.old_log_probs=auto`): no old-log-prob pass,
    the update's forward pass gives the ratio's old log-probs and measures the rollout gap.
    The same step with the pass (``forward``): the same samples, losses, gradient norm, gap
    and, after the step, the same weights (fp32; the two differ only in which forward pass
    computed log-probs of the same weights). Shown to fail with the loss's own log-probs not
    detached as the old ones (the policy gradient then vanishes)."""
    from safetensors.torch import load_file

    runs, weights = {}, {}
    for mode in ("auto", "forward"):
        out = tmp_path / mode
        run_cli(["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, "torchrun", steps=1),
                 "actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
                 "actor.ppo_mini_batch_size=8", f"actor.old_log_probs={mode}", "trainer.test_freq=0",
                 "trainer.export_hf_at_end=true",  # a reward it earns sometimes: advantages not all 0
                 "reward.fn_by_source.synthetic_arith=tests.e2e.offpolicy_plugins:has_digit"])
        runs[mode] = _steps(out)[1]
        weights[mode] = {k: v for f in sorted((out / "hf").glob("*.safetensors")) for k, v in load_file(f).items()}
    auto, forward = runs["auto"], runs["forward"]
    assert "timing/old_log_prob_s" not in auto and "timing/old_log_prob_s" in forward
    assert "timing/ref_s" in auto  # the reference's pass stays (KL loss)
    assert not any(k.startswith("actor/rollout_") for k in auto)  # reported under rollout/ as the pass did
    assert auto["rollout/logprob_diff_max"] < 1e-4 and forward["rollout/logprob_diff_max"] < 1e-4
    for key in ("rollout/logprob_diff_mean", "rollout/prob_diff_max", "actor/pg_loss", "actor/kl_loss",
                "actor/grad_norm", "reward/score/mean", "response_length/mean"):
        assert auto[key] == pytest.approx(forward[key], rel=1e-4, abs=1e-7), key
    assert auto["actor/ratio_max"] == auto["actor/ratio_min"] == 1.0
    assert 0 < auto["reward/score/mean"] < 1  # the policy gradient is not 0
    assert weights["auto"].keys() == weights["forward"].keys() and weights["auto"]
    worst = max(float((weights["auto"][k] - weights["forward"][k]).abs().max()) for k in weights["auto"])
    assert worst <= 1e-6, worst
