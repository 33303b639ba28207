"""Reward workers get an allowlisted environment plus what ``reward.pass_env`` names.

Against the name denylist before this change, PGPASSWORD, DATABASE_URL, GITHUB_PAT and
SLACK_WEBHOOK_URL reached the workers (none of them looks like ``*_TOKEN`` / ``*_KEY``)."""

from pathlib import Path

import pytest

from verl_mp.reward.executor import RewardExecutor
from verl_mp.reward.registry import get_reward_fn
from verl_mp.reward.worker_proc import worker_env

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
import os

def seen(*args):
    """1.0 for each variable the worker's own /proc environment holds (what a child would inherit)."""
    environ = open("/proc/self/environ", "rb").read().split(b"\\0")
    names = {item.split(b"=", 1)[0].decode() for item in environ if item}
    wanted = ("PGPASSWORD", "DATABASE_URL", "GITHUB_PAT", "SLACK_WEBHOOK_URL", "JUDGE_URL", "JUDGE_KEY_2",
              "PATH", "LC_ALL", "PYTHONPATH", "VERL_MP_RUN_ID", "HTTPS_PROXY")
    out = {name: float(name in names and name in os.environ) for name in wanted}
    return {"score": 1.0, **out}
'''

LEAKY = {"PGPASSWORD": "pg", "DATABASE_URL": "postgres://u:pw@db/x", "GITHUB_PAT": "ghp_x",
         "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/x", "HTTPS_PROXY": "http://u:pw@proxy:3128"}


@pytest.fixture
def seen(tmp_path):
    path = tmp_path / "plug.py"
    path.write_text(PLUGIN)
    return get_reward_fn(f"{path}:seen")


def test_secrets_of_any_name_stay_out_and_pass_env_lets_named_ones_in(seen, monkeypatch):
    for name, value in {**LEAKY, "JUDGE_URL": "https://judge", "JUDGE_KEY_2": "k", "LC_ALL": "C.UTF-8",
                        "VERL_MP_RUN_ID": "vmp1x00000000", "PYTHONPATH": str(ROOT)}.items():
        monkeypatch.setenv(name, value)
    executor = RewardExecutor(num_workers=1, timeout_s=20, pass_env=["JUDGE_URL", "JUDGE_KEY_*"])
    try:
        [outcome] = executor.run([(seen, ())])
    finally:
        executor.close()
    assert outcome.status == "ok", outcome.message
    extras = outcome.extras
    assert {name: extras[name] for name in LEAKY} == dict.fromkeys(LEAKY, 0.0)
    assert extras["JUDGE_URL"] == extras["JUDGE_KEY_2"] == 1.0  # named, and matched by a pattern
    # what Python, the locale and the run's identity (the reaper finds workers by it) need
    assert extras["PATH"] == extras["LC_ALL"] == extras["PYTHONPATH"] == extras["VERL_MP_RUN_ID"] == 1.0


def test_allowlisted_prefixes_still_drop_secret_names():
    env = worker_env({"PYTHONPATH": "/x", "VERL_MP_HUB_TOKEN": "t", "LC_PASSWORD": "p", "HOME": "/root"})
    assert env["PYTHONPATH"] == "/x" and env["HOME"] == "/root"
    assert "VERL_MP_HUB_TOKEN" not in env and "LC_PASSWORD" not in env
    assert worker_env({"VERL_MP_HUB_TOKEN": "t"}, pass_env=["VERL_MP_HUB_TOKEN"])["VERL_MP_HUB_TOKEN"] == "t"
