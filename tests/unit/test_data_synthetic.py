"""Synthetic arithmetic data (the tiny tokenizer: test_data_tiny_tokenizer.py)."""

import pyarrow.parquet as pq
import pytest

from verl_mp.data.dataset import PromptDataset
from verl_mp.demo.task import make_rows, write_synthetic_dataset
from verl_mp.demo.tokenizer import build_tiny_tokenizer
from verl_mp.reward.rules import arith_exact_reward

pytestmark = pytest.mark.unit


def test_generation_is_deterministic_and_splits_disjoint(tmp_path):
    train_a, test_a = write_synthetic_dataset(tmp_path / "a", num_train=200, num_test=50, seed=5)
    train_b, _ = write_synthetic_dataset(tmp_path / "b", num_train=200, num_test=50, seed=5)
    train_c, _ = write_synthetic_dataset(tmp_path / "c", num_train=200, num_test=50, seed=6)
    table_a, table_b = pq.read_table(train_a), pq.read_table(train_b)
    assert table_a.equals(table_b) and not table_a.equals(pq.read_table(train_c))
    def prompts(path):
        return {r["prompt"][0]["content"] for r in pq.read_table(path).to_pylist()}
    assert len(prompts(train_a)) == 200 and not prompts(train_a) & prompts(test_a)


def test_rows_are_correct_arithmetic():
    for r in make_rows(100, seed=0, split="train", max_digits=3):
        info = r["extra_info"]
        expected = info["a"] + info["b"] if info["op"] == "+" else info["a"] - info["b"]
        assert r["reward_model"]["ground_truth"] == str(expected) and expected >= 0
        assert r["prompt"][0]["content"] == f"What is {info['a']}{info['op']}{info['b']}?"
        assert r["data_source"] == "synthetic_arith" and r["ability"] == "math"
        reward = arith_exact_reward("synthetic_arith", f"#### {expected}", str(expected), None)
        assert reward["score"] == 1.0


def test_too_many_rows_is_an_error():
    with pytest.raises(ValueError, match="too many"):
        make_rows(101, seed=0, split="train", max_digits=1)


def test_synthetic_files_load_into_dataset(tmp_path):
    train, _ = write_synthetic_dataset(tmp_path, num_train=64, num_test=8, seed=0)
    ds = PromptDataset(train, build_tiny_tokenizer(), max_prompt_length=32)
    assert len(ds) == 64 and ds.num_dropped_too_long == 0
