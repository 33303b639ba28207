"""Bad configuration stops before any process (torchrun ranks or Ray) starts, with an
error that names the setting and, for names, lists the valid choices."""

import re

import pytest

from verl_mp.config.loader import load_config
from verl_mp.trainer import main as trainer_main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("override,message", [
    ("algorithm.adv_estimator=foo", r"unknown advantage estimator 'foo'; valid names: .*gae.*grpo"),
    ("actor.policy_loss=bar", r"unknown policy loss 'bar'; valid names: .*ppo"),
    ("actor.megatron.tensor_model_parallel_size=3", r"tensor_model_parallel_size=3"),
    ("rollout.tensor_model_parallel_size=4", r"rollout.tensor_model_parallel_size=4 must divide"),
    ("data.train_files=[/nonexistent/train.parquet]", r"data.train_files: /nonexistent/train.parquet does not exist"),
    ("model.path=/nonexistent/model", r"model.path='/nonexistent/model' is not an HF checkpoint"),
    ("actor.ppo_mini_batch_size=3", r"data.train_batch_size=8 must be a multiple of actor.ppo_mini_batch_size=3"),
    ("trainer.launcher=mpi", r"trainer.launcher='mpi' is not one of"),
    ("trainer.nproc=64", r"trainer.nproc=64 asks for more ranks"),
    ("rollout.weight_sync_mode=fast", r"rollout.weight_sync_mode='fast' is not one of \('auto', 'gather', 'local'\)"),
    ("rollout.backend=hf rollout.weight_sync_mode=local", r"weight_sync_mode=local needs rollout.backend=vllm"),
    ("rollout.sampling.seed_scope=prompt", r"rollout.sampling.seed_scope='prompt' is not one of \('batch', 'request'\)"),
])
def test_preflight_refuses(inputs, nothing_starts, capsys, override, message):
    rc = trainer_main.main(["--config-name", "grpo", *inputs, *override.split()])
    assert rc == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config key: actor.optim.lrr; valid keys under 'actor.optim': .*'lr'"):
        load_config("grpo", ["actor.optim.lrr=1"])


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match=r"no such preset; valid presets: .*grpo.*ppo"):
        load_config("nope", [])


def test_override_reaches_the_typed_config():
    cfg = load_config("ppo", ["actor.kl_loss_coef=0.5", "algorithm.lam=0.9"])
    assert cfg.actor.kl_loss_coef == 0.5 and cfg.algorithm.lam == 0.9 and cfg.algorithm.adv_estimator == "gae"
