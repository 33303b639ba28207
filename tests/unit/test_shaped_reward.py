"""benchmarks/shaped_reward.py (gpu_grpo.sh REWARD=shaped) loads as the trainer loads a file
plugin and scores a random body's text so that a group's samples differ: its runs update the
weights (the CPU dry run: gnorm 0.7 instead of 0)."""

from pathlib import Path

import pytest

from verl_mp.reward.registry import get_reward_fn

pytestmark = pytest.mark.unit

SPEC = f"{Path(__file__).resolve().parents[2] / 'benchmarks' / 'shaped_reward.py'}:digit_share"


def test_digit_share_through_the_plugin_loader():
    fn = get_reward_fn(SPEC)
    assert fn("synthetic_arith", "12 ab", "7", None) == pytest.approx(0.5)
    assert fn("synthetic_arith", "  \n", "7", None) == 0.0
    assert fn("synthetic_arith", "999", "7", {}) == 1.0
    scores = {fn("synthetic_arith", text, "7", None) for text in ("a1", "bb", "12c", "x9y9z")}
    assert len(scores) == 4  # a group's samples get different rewards: non-zero advantages
