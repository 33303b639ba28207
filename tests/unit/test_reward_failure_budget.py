"""reward.max_failure_fraction: a reward function that fails for most of its calls stops the
step with its name and first errors, at once (the calls still waiting are cancelled); fewer
failures score 0 as before. numpy and torch scalars are scores; NaN and inf are refused.

Before this change every failing call scored 0 and the run went on (a judge that is down:
a whole run of zero rewards), and ``np.float32(1.0)`` was an error."""

import time

import pytest

from verl_mp.reward.executor import RewardExecutor
from verl_mp.reward.manager import RewardManager
from verl_mp.reward.registry import get_reward_fn
from verl_mp.utils.errors import RunFailed
from verl_mp.utils.failure_budget import CallsFailedError, FailureBudget

pytestmark = pytest.mark.unit

PLUGIN = '''
import time
import numpy as np

def always_fails(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "key":
        raise KeyError("answer")
    return 1 / 0

def hangs(data_source, solution_str, ground_truth, extra_info):
    time.sleep(60)

def fine(data_source, solution_str, ground_truth, extra_info):
    return 1.0

def sometimes(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "bad":
        raise ValueError("cannot parse")
    return 1.0

def numpy_scores(data_source, solution_str, ground_truth, extra_info):
    import torch
    return {"f32": np.float32(0.5), "i64": np.int64(2), "arr0": np.array(0.25), "t0": torch.tensor(0.75),
            "dict": {"score": np.float64(1.0), "acc": np.float32(1.0)},
            "nan": np.float32("nan"), "inf": torch.tensor(float("inf")), "vec": np.array([1.0])}[solution_str]
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "judge.py"
    path.write_text(PLUGIN)
    return str(path)


def _score(manager, responses, sources):
    return manager.score(responses, ["1"] * len(responses), sources)


def test_a_function_that_always_fails_stops_with_its_name_and_errors(plugin):
    manager = RewardManager(default_fn=f"{plugin}:always_fails", num_workers=1, max_failure_fraction=0.5)
    try:
        with pytest.raises(CallsFailedError) as err:
            _score(manager, ["a", "key", "b", "c", "d"], ["s"] * 5)
    finally:
        manager.close()
    text = str(err.value)
    assert isinstance(err.value, RunFailed)  # the command line reports it in one line
    assert f"reward function '{plugin}:always_fails' failed" in text and "reward.max_failure_fraction=0.5" in text
    # distinct errors, the last line of each traceback with where it was raised
    assert "[error] ZeroDivisionError: division by zero (judge.py:8 in always_fails)" in text
    assert "[error] KeyError: 'answer' (judge.py:7 in always_fails)" in text
    assert text.count("ZeroDivisionError") == 1
    assert "failed 3 of its 5 calls in this step (2 not run: stopped once the budget was exceeded)" in text


def test_an_exceeded_budget_cancels_the_rest_of_the_batch(plugin):
    """A judge that hangs: 40 calls of 1 s timeouts on 2 workers would take ~20 s; with at most
    10% failures the step stops after the 5th."""
    manager = RewardManager(default_fn=f"{plugin}:hangs", num_workers=2, timeout_s=1.0,
                            max_failure_fraction=0.1)
    start = time.monotonic()
    try:
        with pytest.raises(CallsFailedError, match=r"failed [5-9] of its 40 calls.*\[timeout\] .*1.0s"):
            _score(manager, [f"r{i}" for i in range(40)], ["s"] * 40)
    finally:
        manager.close()
    assert time.monotonic() - start < 14.0


def test_failures_within_the_budget_score_zero(plugin):
    manager = RewardManager(default_fn=f"{plugin}:sometimes", num_workers=0, max_failure_fraction=0.5)
    result = _score(manager, ["bad", "ok", "ok", "ok"], ["s"] * 4)
    assert result.scores.tolist() == [0.0, 1.0, 1.0, 1.0] and result.metrics["reward/num_failed"] == 1


def test_the_budget_is_per_function(plugin):
    """A broken function serving a quarter of the batch stops the step, although 75% of all calls
    succeed."""
    manager = RewardManager(fn_by_source={"judge": f"{plugin}:always_fails", "rule": f"{plugin}:fine"},
                            num_workers=0, max_failure_fraction=0.5)
    with pytest.raises(CallsFailedError, match=r"always_fails' failed 2 of its 2 calls"):
        _score(manager, ["a", "b", "c", "d", "e", "f", "g", "h"], ["judge"] * 2 + ["rule"] * 6)


def test_no_budget_never_stops(plugin):
    manager = RewardManager(default_fn=f"{plugin}:always_fails", num_workers=0)
    assert _score(manager, ["a", "b"], ["s", "s"]).statuses == ["error", "error"]


def test_budget_bounds():
    with pytest.raises(ValueError, match=r"reward.max_failure_fraction=1.5 must be in \[0, 1\]"):
        FailureBudget("reward function", "reward.max_failure_fraction", 1.5)
    from verl_mp.config.loader import load_config

    with pytest.raises(ValueError, match=r"reward.max_failure_fraction=-0.1 must be in \[0, 1\]"):
        load_config("tiny_cpu", ["reward.max_failure_fraction=-0.1"])
    assert load_config("tiny_cpu").reward.max_failure_fraction == 0.5


def test_numpy_and_torch_scalars_are_scores_nan_and_inf_are_not(plugin):
    fn = get_reward_fn(f"{plugin}:numpy_scores")
    executor = RewardExecutor(num_workers=1, timeout_s=60)
    names = ["f32", "i64", "arr0", "t0", "dict", "nan", "inf", "vec"]
    try:
        outcomes = executor.run([(fn, ("s", name, "1", None)) for name in names])
    finally:
        executor.close()
    got = {name: o for name, o in zip(names, outcomes, strict=True)}
    assert [(got[n].status, got[n].score) for n in names[:5]] == \
        [("ok", 0.5), ("ok", 2.0), ("ok", 0.25), ("ok", 0.75), ("ok", 1.0)], [got[n].message for n in names[:5]]
    assert got["dict"].extras == {"acc": 1.0}
    assert got["nan"].status == got["inf"].status == "error"
    assert "returned a non-finite score nan" in got["nan"].message and "non-finite score inf" in got["inf"].message
    assert got["vec"].status == "error" and "expected a float" in got["vec"].message
