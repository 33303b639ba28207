"""benchmarks/rollout_speed.py --data gives vLLM alone the prompts a GRPO run draws first: the
token ids the trainer's own input path (`build_inputs`: dataset, tokenizer, sampler) yields for
the grpo preset with benchmarks/gpu_grpo.sh's prompt length, compared id for id."""

import importlib.util
from pathlib import Path

import pytest

from verl_mp.config.loader import load_config
from verl_mp.demo.task import write_synthetic_dataset
from verl_mp.demo.tiny_models import save_tiny_qwen2
from verl_mp.trainer.setup import build_inputs

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rollout_speed.py"


def test_data_prompts_are_the_runs_first_batch(tmp_path):
    write_synthetic_dataset(str(tmp_path / "data"), num_train=300, num_test=8, seed=0)
    save_tiny_qwen2(str(tmp_path / "model"), num_kv_heads=2, hidden_size=32, num_layers=1, num_heads=2,
                    intermediate_size=64)
    train = str(tmp_path / "data" / "train.parquet")
    spec = importlib.util.spec_from_file_location("rollout_speed", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ours = bench.prompts(64, train, str(tmp_path / "model"))
    cfg = load_config("grpo", [f"model.path={tmp_path / 'model'}", f"data.train_files=[{train}]", "data.val_files=[]",
                               "data.train_batch_size=64", "data.max_prompt_length=64"])
    inputs = build_inputs(cfg, score_rewards=False)
    first = inputs.train.get_batch(inputs.sampler.next_batch()).input_ids
    assert ours == first
    assert ours != inputs.train.get_batch(list(range(64))).input_ids  # shuffled: the order matters
    assert bench.prompts(64) != ours  # the default stays random token ids
