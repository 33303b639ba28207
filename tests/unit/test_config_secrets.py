"""Values from the environment (``${oc.env:X}``) never reach what the trainer writes out: the
logged config, the saved config.yaml (and so checkpoints, which copy `to_yaml`), TensorBoard and
W&B. Against the code before this change, `to_yaml` and the saved config.yaml held the value
and the tracker's config re-resolved it (the first three tests failed)."""

import dataclasses
import logging

import pytest

from verl_mp.cli import main as cli_main
from verl_mp.config.loader import _refuse_literal_secrets, load_config, to_yaml
from verl_mp.trainer.tracking import _config_as_dict, _config_as_markdown
from verl_mp.utils.secrets import looks_secret

pytestmark = pytest.mark.unit

SECRET = "hunter2-0123456789"


def test_env_values_are_written_as_references_and_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("RUN_SECRET", SECRET)
    monkeypatch.setenv("NUM_STEPS", "7")
    cfg = load_config("tiny_cpu", ["trainer.experiment_name=${oc.env:RUN_SECRET}",
                                   "trainer.project_name=p-${oc.env:RUN_SECRET}",
                                   "trainer.total_steps=${oc.env:NUM_STEPS}"])
    assert cfg.trainer.experiment_name == SECRET and cfg.trainer.total_steps == 7
    text = to_yaml(cfg)
    assert SECRET not in text
    assert "experiment_name: ${oc.env:RUN_SECRET}" in text and "p-${oc.env:RUN_SECRET}" in text
    saved = tmp_path / "config.yaml"
    saved.write_text(text)
    again = load_config(str(saved))  # what every rank does with the saved file
    assert again.trainer.experiment_name == SECRET and again.trainer.project_name == f"p-{SECRET}"
    assert again.trainer.total_steps == 7 and SECRET not in to_yaml(again)


def test_tracker_config_keeps_references(monkeypatch):
    monkeypatch.setenv("RUN_SECRET", SECRET)
    text = to_yaml(load_config("tiny_cpu", ["trainer.experiment_name=${oc.env:RUN_SECRET}"]))
    assert _config_as_dict(text)["trainer"]["experiment_name"] == "${oc.env:RUN_SECRET}"  # W&B
    assert SECRET not in _config_as_markdown(text)  # TensorBoard


def test_saved_config_and_log_hold_no_secret(inputs, nothing_starts, monkeypatch, caplog, tmp_path, capsys):
    monkeypatch.setenv("RUN_SECRET", SECRET)
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        rc = cli_main(["train", "--config-name", "grpo", *inputs, f"trainer.default_local_dir={out}",
                                "trainer.experiment_name=${oc.env:RUN_SECRET}", "--prepare-only"])
    assert rc == 0
    saved = (out / "config.yaml").read_text()
    assert "${oc.env:RUN_SECRET}" in saved and SECRET not in saved
    assert "experiment_name: ${oc.env:RUN_SECRET}" in caplog.text and SECRET not in caplog.text
    assert SECRET not in capsys.readouterr().out


def test_literal_secret_in_a_secret_named_field_is_refused():
    @dataclasses.dataclass
    class Hub:
        api_key: str = ""
        max_new_tokens: int = 5

    @dataclasses.dataclass
    class Root:
        hub: Hub = dataclasses.field(default_factory=Hub)

    _refuse_literal_secrets(Root(), (), {})  # empty: fine
    _refuse_literal_secrets(Root(Hub(api_key="k")), (), {("hub", "api_key"): ("${oc.env:K}", "k")})
    with pytest.raises(ValueError, match=r"hub.api_key holds a literal secret.*\$\{oc.env:YOUR_VARIABLE\}"):
        _refuse_literal_secrets(Root(Hub(api_key="k")), (), {})


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("RAY_AUTH_TOKEN", True),
    ("hub.password", True), ("OPENAI_APIKEY", True), ("max_new_tokens", False), ("pad_token_id", False),
    ("stop_token_ids", False), ("MONKEY", False), ("PATH", False), ("KEYBOARD", False),
])
def test_secret_names(name, secret):
    assert looks_secret(name) is secret
