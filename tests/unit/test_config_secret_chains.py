"""A secret that reaches a config field through a chain of interpolations (``a: ${oc.env:S}``,
``b: ${a}``, ``c: p-${.b}``) is never written resolved: not into the run's config.yaml (through
`verl-mp train`, the function that writes it), not into a checkpoint's copy, not into the log.

Before this change only values whose own text named ``oc.env`` were written as references:
``b`` and ``c`` reached config.yaml with the secret in them."""

import logging

import pytest
import yaml

from verl_mp.cli import main as cli_main
from verl_mp.config.loader import load_config, to_yaml

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-chain-0123456789"



def test_a_chained_secret_never_reaches_config_yaml(inputs, nothing_starts, monkeypatch, caplog, capsys, tmp_path):
    monkeypatch.setenv("CHAIN_SECRET", SECRET)
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        rc = cli_main(["train", "--config-name", "grpo", *inputs, f"trainer.default_local_dir={out}",
                       "trainer.experiment_name=${oc.env:CHAIN_SECRET}",
                       "trainer.project_name=p-${.experiment_name}",  # a relative reference, in a string
                       "reward.pass_env=['${trainer.project_name}']",  # two links away, in a list
                       "--prepare-only"])
    assert rc == 0
    saved = (out / "config.yaml").read_text()
    assert SECRET not in saved and SECRET not in caplog.text and SECRET not in capsys.readouterr().out
    written = yaml.safe_load(saved)["trainer"]
    assert written["experiment_name"] == "${oc.env:CHAIN_SECRET}"
    assert written["project_name"] == "p-${.experiment_name}"
    assert yaml.safe_load(saved)["reward"]["pass_env"] == ["${trainer.project_name}"]
    again = load_config(str(out / "config.yaml"))  # what every rank does with it
    assert again.trainer.project_name == f"p-{SECRET}" and again.reward.pass_env == [f"p-{SECRET}"]
    assert SECRET not in to_yaml(again)


def test_a_chained_secret_never_reaches_a_checkpoint(tmp_path, monkeypatch):
    from tests.unit.test_trainer_resume_check import make_cfg, make_model, trainer

    monkeypatch.setenv("CHAIN_SECRET", SECRET)
    cfg = make_cfg(tmp_path, make_model(tmp_path / "model"), "trainer.experiment_name=${oc.env:CHAIN_SECRET}",
                   "trainer.project_name=${trainer.experiment_name}")
    assert cfg.trainer.project_name == SECRET
    trainer(cfg).save(1)
    saved = (tmp_path / "out" / "checkpoints" / "global_step_1" / "config.yaml").read_text()
    assert SECRET not in saved and "project_name: ${trainer.experiment_name}" in saved


def test_a_secret_named_field_may_come_through_a_chain_but_not_from_a_literal():
    import dataclasses

    from verl_mp.config.loader import _from_environment, _refuse_literal_secrets

    chain = {("a",): ("${oc.env:S}", "v"), ("b",): ("${a}", "v"), ("hub", "api_key"): ("${..b}", "v"),
             ("lit",): ("${c}", "v")}
    assert _from_environment(chain) == {("a",), ("b",), ("hub", "api_key")}

    @dataclasses.dataclass
    class Hub:
        api_key: str = "v"

    @dataclasses.dataclass
    class Root:
        hub: Hub = dataclasses.field(default_factory=Hub)

    _refuse_literal_secrets(Root(), (), _from_environment(chain))  # from the environment, two links away
    literal = {("c",): ("x-${d}", "v"), ("hub", "api_key"): ("${c}", "v")}
    with pytest.raises(ValueError, match="hub.api_key holds a literal secret"):
        _refuse_literal_secrets(Root(), (), _from_environment(literal))
