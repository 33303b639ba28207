"""A reward function that always fails (a judge service that is down) stops the real run in
its first step, with the function's name and its error on the last line of the console,
under torchrun and under Ray (reward.max_failure_fraction, default 0.5).

Before this change every call scored 0 and the run trained on zero rewards to the end."""

import subprocess
import sys

import pytest

from .helpers import base_overrides

pytestmark = pytest.mark.e2e

JUDGE = '''
def judge(data_source, solution_str, ground_truth, extra_info):
    raise ConnectionError("judge service unreachable at http://judge:8000")
'''


@pytest.mark.parametrize("launcher", ["torchrun", "ray"])
def test_a_reward_function_that_always_fails_stops_the_run_in_step_1(tiny_run_inputs, tmp_path, launcher):
    plugin = tmp_path / "judge.py"
    plugin.write_text(JUDGE)
    out = tmp_path / launcher
    args = ["--config-name", "grpo", *base_overrides(tiny_run_inputs, out, launcher, steps=3),
            "trainer.val_before_train=false", "trainer.test_freq=0",
            f"reward.fn_by_source.synthetic_arith={plugin}:judge"]
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "train", *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("verl-mp train: run failed: "), last
    assert f"reward function '{plugin}:judge' failed" in last and "reward.max_failure_fraction=0.5" in last, last
    assert "ConnectionError: judge service unreachable at http://judge:8000 (judge.py:3 in judge)" in last, last
    if launcher == "torchrun":
        assert "rank 0 failed in phase reward of step 1" in last, last
    else:
        assert "phase reward of step 1" in last, last
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()
