"""Loading configuration: overrides reach the typed config; unknown keys and presets list
the valid ones (the whole bad-input sweep is test_bad_input.py)."""


import pytest

from verl_mp.config.loader import load_config

pytestmark = pytest.mark.unit


def test_unknown_key_suggests_the_closest_or_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config key: actor.optim.lrr; did you mean actor.optim.lr\?"):
        load_config("grpo", ["actor.optim.lrr=1"])
    with pytest.raises(ValueError, match=r"unknown config key: actor.optim.zzz; valid keys under 'actor.optim': .*'lr'"):
        load_config("grpo", ["actor.optim.zzz=1"])


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match=r"no such preset; valid presets: .*grpo.*ppo"):
        load_config("nope", [])


def test_override_reaches_the_typed_config():
    cfg = load_config("ppo", ["actor.kl_loss_coef=0.5", "algorithm.lam=0.9"])
    assert cfg.actor.kl_loss_coef == 0.5 and cfg.algorithm.lam == 0.9 and cfg.algorithm.adv_estimator == "gae"


def test_train_help_lists_presets_and_the_most_used_keys_with_defaults(capsys):
    import pytest as _pytest

    from verl_mp.cli import main as cli_main

    with _pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    out = capsys.readouterr().out
    assert "grpo" in out and "ppo" in out and "tiny_cpu" in out  # the presets
    assert "trainer.save_freq" in out and "actor.optim.lr" in out and "1e-06" in out


def test_config_show_prints_values_and_docstrings(capsys):
    from verl_mp.cli import main as cli_main

    assert cli_main(["config", "show", "--config-name", "grpo", "actor.optim.lr=3e-6"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "actor.optim.lr = 3e-06    # Peak learning rate (after warm-up)." in out
    assert any(line.startswith("algorithm.adv_estimator = 'grpo'") for line in out)


def test_more_ranks_than_cores_warns(monkeypatch, caplog):
    import logging

    from verl_mp.utils import launch

    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    with caplog.at_level(logging.WARNING):
        launch.warn_oversubscribed(4)
    assert "trainer.nproc=4 ranks on 2 CPU cores" in caplog.text
