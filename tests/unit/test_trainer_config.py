"""Loading configuration: overrides reach the typed config; unknown keys and presets list
the valid ones (the whole bad-input sweep is test_bad_input.py)."""


import pytest

from verl_mp.config.loader import load_config

pytestmark = pytest.mark.unit


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config key: actor.optim.lrr; valid keys under 'actor.optim': .*'lr'"):
        load_config("grpo", ["actor.optim.lrr=1"])


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match=r"no such preset; valid presets: .*grpo.*ppo"):
        load_config("nope", [])


def test_override_reaches_the_typed_config():
    cfg = load_config("ppo", ["actor.kl_loss_coef=0.5", "algorithm.lam=0.9"])
    assert cfg.actor.kl_loss_coef == 0.5 and cfg.algorithm.lam == 0.9 and cfg.algorithm.adv_estimator == "gae"
