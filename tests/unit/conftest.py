"""Fixtures shared by the trainer's bad-input tests."""

import pytest


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Overrides pointing a preset at a tiny model and data written for the test module."""
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    root = tmp_path_factory.mktemp("run_inputs")
    model = save_tiny_qwen2(root / "model")
    train, _ = write_synthetic_dataset(root / "data", num_train=64, num_test=8)
    return [f"model.path={model}", f"data.train_files=[{train}]", "rollout.max_model_len=128",
            "rollout.val_sampling.max_new_tokens=16", "rollout.sampling.max_new_tokens=16",
            "data.max_prompt_length=64", f"trainer.default_local_dir={root / 'out'}"]


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if the trainer would start torchrun ranks or Ray workers."""
    from verl_mp.trainer import run as trainer_run

    def forbidden(*a, **k):
        raise AssertionError("a process was started despite invalid input")

    monkeypatch.setattr("verl_mp.utils.launch.launch_local", forbidden)
    monkeypatch.setattr(trainer_run, "_run_ray", forbidden)
