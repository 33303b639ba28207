"""Resume refuses a checkpoint written by a different run (RLTrainer.save/resume with fake
workers, and the pre-start check of the CLI); the demo keys its output directory."""

import json
import logging
from dataclasses import replace

import pytest

from verl_mp.config.loader import load_config
from verl_mp.data.sampler import ResumableBatchSampler
from verl_mp.demo import warm_start as demo
from verl_mp.plan import build_plan
from verl_mp.trainer.loop import RLTrainer
from verl_mp.trainer.resume_check import config_differences, preflight_resume
from verl_mp.trainer.setup import RunInputs

pytestmark = pytest.mark.unit


class FakeWorkers:
    def __init__(self):
        self.loaded = []

    def describe(self):
        return {"actor_rollout_ref": {"flop_params": 1, "world_size": 1}}

    def save_checkpoint(self, directory):
        with open(f"{directory}/actor.pt", "w") as f:
            f.write("weights")

    def load_checkpoint(self, directory):
        self.loaded.append(directory)

    def sync_weights(self):
        return {}


def make_model(path, hidden_size=64):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden_size}))
    (path / "tokenizer.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 128)
    return path


def make_cfg(tmp_path, model, *overrides):
    return load_config("tiny_cpu", [f"model.path={model}", f"data.train_files=[{tmp_path / 'train.parquet'}]",
                                    f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.logger=[jsonl]",
                                    *overrides])


def trainer(cfg):
    sampler = ResumableBatchSampler(64, cfg.data.train_batch_size, seed=cfg.data.seed)
    inputs = RunInputs(tokenizer=None, train=None, val=None, sampler=sampler, reward=None, pad_token_id=0)
    return RLTrainer(cfg, build_plan(cfg), inputs, FakeWorkers())


@pytest.fixture
def saved_run(tmp_path):
    """A run that saved its step-2 checkpoint; returns (its config, the checkpoint dir)."""
    cfg = make_cfg(tmp_path, make_model(tmp_path / "model"))
    t = trainer(cfg)
    t.inputs.sampler.next_batch()
    t.save(2)
    return cfg, tmp_path / "out" / "checkpoints" / "global_step_2"


def test_same_run_resumes_despite_execution_changes(tmp_path, saved_run):
    _, ckpt = saved_run
    # longer run, another layout and rank count, another launcher: still the same run
    cfg = make_cfg(tmp_path, tmp_path / "model", "trainer.total_steps=50", "trainer.max_steps_this_run=3",
                   "actor.megatron.tensor_model_parallel_size=1", "rollout.tensor_model_parallel_size=1",
                   "trainer.nproc=1", "trainer.launcher=torchrun", "data.val_batch_size=8",
                   "rollout.weight_sync_mode=gather")
    preflight_resume(cfg)
    t = trainer(cfg)
    assert t.resume() == 2 and t.workers.loaded == [str(ckpt)]
    assert t.inputs.sampler.state_dict()["position"] == 1


@pytest.mark.parametrize("override,named", [
    ("actor.optim.lr=1e-3", "actor.optim.lr"),
    ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator"),
    ("rollout.sampling.n=4", "rollout.sampling.n"),
])
def test_auto_resume_refuses_a_different_config(tmp_path, saved_run, override, named):
    _, ckpt = saved_run
    cfg = make_cfg(tmp_path, tmp_path / "model", override)
    t = trainer(cfg)
    with pytest.raises(ValueError) as err:
        t.resume()
    message = str(err.value)
    for text in (str(ckpt), named, "trainer.resume_mode=disable", "trainer.default_local_dir"):
        assert text in message
    assert t.workers.loaded == []
    with pytest.raises(ValueError, match=named):  # the CLI fails before any process starts
        preflight_resume(cfg)


def test_auto_resume_refuses_another_model(tmp_path, saved_run):
    other = make_model(tmp_path / "other_model")
    with pytest.raises(ValueError, match="model.path"):
        trainer(make_cfg(tmp_path, other)).resume()
    # same path, model rebuilt with another architecture (e.g. the demo's warm start cache)
    make_model(tmp_path / "model", hidden_size=128)
    with pytest.raises(ValueError, match=r"model directory \(model.path\).*config.json"):
        trainer(make_cfg(tmp_path, tmp_path / "model")).resume()


def test_explicit_path_resumes_with_a_warning(tmp_path, saved_run, caplog):
    _, ckpt = saved_run
    cfg = make_cfg(tmp_path, tmp_path / "model", "actor.optim.lr=1e-3", f"trainer.resume_mode={ckpt}")
    preflight_resume(cfg)
    t = trainer(cfg)
    with caplog.at_level(logging.WARNING):
        assert t.resume() == 2
    assert "different run" in caplog.text and "actor.optim.lr" in caplog.text


def test_disable_ignores_the_old_checkpoint(tmp_path, saved_run):
    cfg = make_cfg(tmp_path, tmp_path / "other", "actor.optim.lr=1e-3", "trainer.resume_mode=disable")
    preflight_resume(cfg)
    assert trainer(cfg).resume() == 0


def test_checkpoint_of_older_code(tmp_path, saved_run):
    """No model fingerprint and fewer config keys: the common keys are still compared."""
    _, ckpt = saved_run
    state = json.loads((ckpt / "trainer_state.json").read_text())
    del state["model_fingerprint"]
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    config = (ckpt / "config.yaml").read_text().replace("  export_hf_at_end: true\n", "")
    (ckpt / "config.yaml").write_text(config)
    assert trainer(make_cfg(tmp_path, tmp_path / "model")).resume() == 2
    with pytest.raises(ValueError, match="actor.optim.lr"):
        trainer(make_cfg(tmp_path, tmp_path / "model", "actor.optim.lr=1e-3")).resume()


def test_paths_compare_normalised():
    saved = {"model": {"path": "/ckpt/m/"}, "data": {"train_files": ["/d/./t.parquet"]}}
    now = {"model": {"path": "/ckpt/m"}, "data": {"train_files": ["/d/t.parquet"]}}
    assert config_differences(saved, now) == []


def test_demo_output_dir_is_keyed_by_the_demo(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_MP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "_cached", lambda record, model_dir: True)  # skip the warm start
    cfg = load_config("tiny_cpu", [])
    key = demo.demo_key(demo.DemoSettings())
    out = demo.prepare_demo(cfg)
    assert out.trainer.default_local_dir == f"outputs/demo/demo-{key}"
    assert out.model.path == str(tmp_path / "cache" / f"demo-{key}" / "sft_model")
    changed = demo.prepare_demo(cfg, replace(demo.DemoSettings(), seed=1))
    assert changed.trainer.default_local_dir != out.trainer.default_local_dir
    own = demo.prepare_demo(load_config("tiny_cpu", ["trainer.default_local_dir=runs/mine"]))
    assert own.trainer.default_local_dir == "runs/mine"


def test_cli_refuses_a_stale_output_dir_before_anything_starts(tmp_path, monkeypatch, capsys):
    from verl_mp.cli import main as cli_main
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2
    from verl_mp.trainer import run as trainer_run

    model = save_tiny_qwen2(tmp_path / "model", hidden_size=64, num_layers=1)
    train, _ = write_synthetic_dataset(tmp_path / "data", num_train=64, num_test=8)
    args = [f"model.path={model}", f"data.train_files=[{train}]", "rollout.max_model_len=128",
            "rollout.sampling.max_new_tokens=16", "rollout.val_sampling.max_new_tokens=16",
            "data.max_prompt_length=64", f"trainer.default_local_dir={tmp_path / 'out'}"]
    old = trainer(load_config("grpo", [*args, "actor.optim.lr=0.5"]))  # an earlier run, another lr
    old.save(4)

    def forbidden(*a, **k):
        raise AssertionError("a process was started despite a stale checkpoint")

    monkeypatch.setattr("verl_mp.utils.launch.launch_local", forbidden)
    monkeypatch.setattr(trainer_run, "_run_ray", forbidden)
    assert cli_main(["train", "--config-name", "grpo", *args]) == 2
    err = capsys.readouterr().err
    assert "global_step_4 was written by a different run" in err and "actor.optim.lr: 0.5" in err
    assert "trainer.resume_mode=disable" in err
    monkeypatch.setattr(trainer_run, "_finish", lambda cfg, started=None, stopped=False: None)
    monkeypatch.setattr(trainer_run, "_run_ray", lambda cfg, plan, stop, verbose, temp_dir: None)
    monkeypatch.setattr("verl_mp.utils.launch.launch_local", lambda *a, **k: None)
    assert cli_main(["train", "--config-name", "grpo", *args, "trainer.resume_mode=disable"]) == 0
