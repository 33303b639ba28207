"""RewardExecutor: result normalization and the backstop for uninterruptible hangs."""

import time

import pytest

from verl_mp.reward.executor import RewardExecutor, normalize_result
from verl_mp.reward.registry import get_reward_fn

pytestmark = pytest.mark.unit

PLUGIN = '''
import signal, time

def stuck(*args):
    # Ignore the timer, like C code that never returns to the interpreter.
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(60)

def fine(*args):
    return 1.0
'''


def test_normalize_result():
    assert normalize_result(1) == (1.0, {})
    assert normalize_result({"score": 0.5, "acc": True, "pred": "7"}) == (0.5, {"acc": 1.0})
    for bad in ({"acc": 1.0}, None, "1.0", True, float("inf")):
        with pytest.raises((TypeError, ValueError)):
            normalize_result(bad)


def test_backstop_kills_stuck_worker_and_recovers(tmp_path):
    path = tmp_path / "plug.py"
    path.write_text(PLUGIN)
    stuck, fine = get_reward_fn(f"{path}:stuck"), get_reward_fn(f"{path}:fine")
    executor = RewardExecutor(num_workers=1, timeout_s=0.2, backstop_grace_s=1.0)
    try:
        start = time.monotonic()
        outcomes = executor.run([(stuck, ()), (fine, ())])
        assert time.monotonic() - start < 6.0
        assert [o.status for o in outcomes] == ["timeout", "timeout"]
        assert [o.status for o in executor.run([(fine, ())])] == ["ok"]  # a fresh pool
    finally:
        executor.close()
