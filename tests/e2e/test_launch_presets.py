"""What README lists and nothing else ran: `launch/torchrun.sh` starting a run of the `dapo`
preset, trained for a step, and `rollout.logprob_diff_threshold` set through the config
stopping a run with the documented message."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LAYOUT = ["actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2"]


def test_torchrun_script_trains_the_dapo_preset_for_a_step(tiny_run_inputs, tmp_path):
    """``NPROC=2 bash launch/torchrun.sh --config-name dapo ...``: the script picks the
    launcher and the rank count (the overrides here name neither), the preset's clip-higher
    and token-mean settings reach the resolved config, and step 1 trains (a policy loss, a
    gradient, no KL term: DAPO has none). The reward is one the random tiny model earns
    sometimes (a digit in the response), so that the step has advantages to train on."""
    out = tmp_path / "dapo"
    overrides = [o for o in base_overrides(tiny_run_inputs, out, "torchrun", steps=1)
                 if not o.startswith("trainer.launcher=")]
    proc = subprocess.run(["bash", str(REPO / "launch" / "torchrun.sh"), "--config-name", "dapo", *overrides, *LAYOUT,
                           "reward.fn_by_source.synthetic_arith=tests.e2e.offpolicy_plugins:has_digit"],
                          env={**os.environ, "NPROC": "2", "PYTHON": sys.executable}, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = OmegaConf.load(out / "config.yaml")
    assert (cfg.trainer.launcher, cfg.trainer.nproc) == ("torchrun", 2)
    assert (cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) == (0.2, 0.28)
    assert cfg.actor.loss_agg_mode == "token-mean" and cfg.actor.use_kl_loss is False
    assert cfg.algorithm.adv_estimator == "grpo"
    rows = {r["step"]: r for r in read_jsonl(str(out / "metrics.jsonl"))}
    assert sorted(rows) == [0, 1]  # the validation before training, and the step
    step = rows[1]
    assert 0 < step["reward/score/mean"] < 1, step  # some samples earned it: advantages are not all 0
    assert math.isfinite(step["actor/pg_loss"]) and step["actor/grad_norm"] > 0 and "actor/clipfrac" in step, step
    assert "actor/kl_loss" not in step and step["rollout/logprob_diff_max"] < 1e-4


def test_logprob_gap_over_the_threshold_stops_the_run(tiny_run_inputs, tmp_path):
    """``rollout.logprob_diff_threshold`` far below the fp32 gap (~1e-6): the first step
    stops the run before it trains, with the message docs/troubleshooting.md describes,
    named on the run's last console line; nothing of the step is logged or saved."""
    out = tmp_path / "gap"
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "train", "--config-name", "grpo",
                           *base_overrides(tiny_run_inputs, out, "torchrun", steps=2), *LAYOUT,
                           "rollout.logprob_diff_threshold=1e-12", "trainer.save_freq=1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("verl-mp train: run failed: rank "), last
    assert re.search(r"failed in phase \w+ of step 1: RuntimeError: step 1: rollout/trainer log-prob gap [0-9.e+-]+ exceeds "
                     r"rollout\.logprob_diff_threshold=1e-12: the weight sync or the rollout numerics "
                     r"disagree with the trainer", last), last
    assert [r["step"] for r in read_jsonl(str(out / "metrics.jsonl"))] == [0]  # the validation only
    assert not list((out / "checkpoints").glob("global_step_*"))
