"""Registries: built-in names, duplicates, unknown names, `module:function` plugins."""

import pytest

from verl_mp.algo import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    resolve,
)

pytestmark = pytest.mark.unit


def test_builtin_names():
    assert {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
    } <= set(ADVANTAGE_ESTIMATORS)
    assert {"ppo", "gspo", "pg"} <= set(POLICY_LOSSES)
    assert {"k1", "k2", "k3", "low_var_kl", "abs"} <= set(KL_ESTIMATORS)
    assert KL_ESTIMATORS["low_var_kl"] is KL_ESTIMATORS["k3"]


def test_register_and_duplicate():
    reg = Registry("thing")

    @reg.register("a")
    def fn_a():
        return 1

    assert reg["a"] is fn_a and "a" in reg and len(reg) == 1 and list(reg) == ["a"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    with pytest.raises(ValueError, match="contain no ':'"):
        reg.add("x:y", fn_a)


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownNameError, match="valid names: .*grpo.*rloo") as info:
        ADVANTAGE_ESTIMATORS["grpoo"]
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "grpoo" not in ADVANTAGE_ESTIMATORS


def test_plugin_path_resolves():
    fn = POLICY_LOSSES["verl_mp.algo.policy_loss:ppo"]
    assert fn is POLICY_LOSSES["ppo"]
    assert resolve("os.path:join")("a", "b").endswith("b")


@pytest.mark.parametrize(
    "path, message",
    [
        ("no_such_pkg_xyz.mod:fn", "cannot import module"),
        ("os.path:no_such_fn", "has no attribute"),
        ("os:sep", "not a function"),
        ("os.path:", "must look like"),
    ],
)
def test_plugin_errors(path, message):
    with pytest.raises(ValueError, match=message):
        resolve(path)
