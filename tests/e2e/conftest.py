"""Shared fixtures for end-to-end runs of the real CLI: a tiny model and data set."""

import pytest


@pytest.fixture(scope="session")
def tiny_run_inputs(tmp_path_factory):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    root = tmp_path_factory.mktemp("e2e_inputs")
    model = save_tiny_qwen2(root / "model")
    train, test = write_synthetic_dataset(root / "data", num_train=256, num_test=16, seed=0)
    return {"model": str(model), "train": str(train), "test": str(test)}
