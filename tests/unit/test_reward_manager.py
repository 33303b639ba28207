"""RewardManager: routing, failures and timeouts never crash, metrics, token-level rewards."""

import time

import pytest
import torch

from verl_mp.reward.manager import RewardManager, token_level_rewards

pytestmark = pytest.mark.unit

PLUGIN = '''
import time

def boom(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "boom":
        raise RuntimeError("reward exploded")
    return {"score": 1.0, "acc": 1.0}

def hang(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        while True:
            time.sleep(0.01)
    if solution_str == "swallow":  # a broad except must not eat the timeout
        try:
            time.sleep(60)
        except Exception:
            return 1.0
    return 0.5

def garbage(data_source, solution_str, ground_truth, extra_info):
    return {"score": float("nan")} if solution_str == "nan" else "not a number"
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "plug.py"
    path.write_text(PLUGIN)
    return str(path)


@pytest.fixture(scope="module")
def pooled(plugin):
    """One manager with worker processes, shared to pay the spawn cost once."""
    manager = RewardManager(
        fn_by_source={"boom": f"{plugin}:boom", "hang": f"{plugin}:hang"},
        timeout_s=0.5, num_workers=2,
    )
    yield manager
    manager.close()


def test_rules_routed_by_data_source(pooled):
    result = pooled.score(["#### 7", "#### 8", r"\boxed{0.5}", "#### 85"], ["7", "7", "1/2", "85"],
                          ["openai/gsm8k", "openai/gsm8k", "lighteval/MATH", "synthetic_arith"])
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 1.0] and result.scores.dtype == torch.float32
    assert result.metrics["reward/score/mean"] == 0.75 and result.metrics["reward/accuracy"] == 0.75
    assert result.metrics["reward/score/max"] == 1.0
    assert result.metrics["reward/num_failed"] == 0 and result.metrics["reward/num_timeout"] == 0


def test_raising_function_scores_zero_and_is_counted(pooled):
    result = pooled.score(["ok", "boom", "ok"], ["", "", ""], ["boom"] * 3)
    assert result.scores.tolist() == [1.0, 0.0, 1.0]
    assert result.statuses == ["ok", "error", "ok"] and result.metrics["reward/num_failed"] == 1


def test_hanging_function_times_out_quickly(pooled):
    start = time.monotonic()
    result = pooled.score(["hang", "fine", "swallow", "fine"], [""] * 4, ["hang"] * 4)
    assert time.monotonic() - start < 5.0
    assert result.statuses == ["timeout", "ok", "timeout", "ok"]
    assert result.scores.tolist() == [0.0, 0.5, 0.0, 0.5]
    assert result.metrics["reward/num_timeout"] == 2
    # the pool is still usable afterwards
    assert pooled.score(["fine"], [""], ["hang"]).statuses == ["ok"]


def test_inline_mode_catches_bad_returns(plugin):
    manager = RewardManager(default_fn=f"{plugin}:garbage", num_workers=0)
    result = manager.score(["nan", "x"], ["", ""], ["a", "b"])
    assert result.statuses == ["error", "error"] and result.metrics["reward/num_failed"] == 2


def test_unknown_source_is_a_config_error():
    manager = RewardManager(num_workers=0)
    with pytest.raises(ValueError, match="no reward function for data_source 'mystery'"):
        manager.check_sources(["openai/gsm8k", "mystery"])


def test_unpicklable_function_rejected_for_workers(monkeypatch):
    from verl_mp.reward import registry

    monkeypatch.setattr(registry, "REWARD_FUNCTIONS", dict(registry.REWARD_FUNCTIONS))
    registry.register_reward("local_lambda")(lambda *a: 1.0)
    with pytest.raises(ValueError, match="cannot be sent to reward worker processes"):
        RewardManager(default_fn="local_lambda", num_workers=1)


def test_token_level_rewards_on_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]])
    rewards = token_level_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    expected = torch.zeros(4, 4)
    expected[0, 2], expected[1, 0], expected[3, 3] = 1.0, 2.0, 4.0  # all-masked row: nothing
    assert rewards.dtype == torch.float32 and torch.equal(rewards, expected)
