"""Reward registry: duplicates, unknown names, module:function and file plugins."""

import pickle
import sys

import pytest

from verl_mp.reward import registry
from verl_mp.reward.registry import get_reward_fn, register_reward

pytestmark = pytest.mark.unit


def test_builtins_registered():
    for name in ("gsm8k", "math_boxed", "arith_exact", "format"):
        assert callable(get_reward_fn(name))


def test_duplicate_name_raises(monkeypatch):
    monkeypatch.setattr(registry, "REWARD_FUNCTIONS", dict(registry.REWARD_FUNCTIONS))
    register_reward("my_rule")(lambda *a: 1.0)
    with pytest.raises(ValueError, match="'my_rule' is already registered"):
        register_reward("my_rule")(lambda *a: 0.0)


def test_unknown_name_lists_valid_ones():
    expected = r"unknown reward function 'gsm9k'.*'arith_exact'.*'gsm8k'"
    with pytest.raises(ValueError, match=expected):
        get_reward_fn("gsm9k")


def test_module_plugin(tmp_path, monkeypatch):
    source = "def length(ds, sol, gt, extra):\n    return len(sol)\n"
    (tmp_path / "my_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rewards", None)  # another test's module of that name (docs/extending.md's)
    fn = get_reward_fn("my_rewards:length")
    assert fn("s", "abc", "", None) == 3
    with pytest.raises(ValueError, match=r"no function 'nope'; callables there: \['length'\]"):
        get_reward_fn("my_rewards:nope")
    sys.modules.pop("my_rewards", None)


def test_missing_module_plugin():
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod_xyz'.*PYTHONPATH"):
        get_reward_fn("no_such_mod_xyz:fn")


def test_file_plugin_pickles_by_path(tmp_path):
    path = tmp_path / "plug.py"
    path.write_text("def one(ds, sol, gt, extra):\n    return 1.0\n")
    fn = get_reward_fn(f"{path}:one")
    clone = pickle.loads(pickle.dumps(fn))
    assert clone("s", "", "", None) == 1.0
    with pytest.raises(ValueError, match="does not exist"):
        get_reward_fn(f"{tmp_path / 'missing.py'}:one")
