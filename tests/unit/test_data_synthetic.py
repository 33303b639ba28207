"""Synthetic arithmetic data and the tiny tokenizer built for it."""

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from verl_mp.data.dataset import PromptDataset
from verl_mp.data.synthetic import make_rows, write_synthetic_dataset
from verl_mp.data.tiny_tokenizer import build_tiny_tokenizer, save_tiny_tokenizer
from verl_mp.reward.rules import arith_exact_reward

pytestmark = pytest.mark.unit


def test_generation_is_deterministic_and_splits_disjoint(tmp_path):
    train_a, test_a = write_synthetic_dataset(tmp_path / "a", num_train=200, num_test=50, seed=5)
    train_b, _ = write_synthetic_dataset(tmp_path / "b", num_train=200, num_test=50, seed=5)
    train_c, _ = write_synthetic_dataset(tmp_path / "c", num_train=200, num_test=50, seed=6)
    table_a, table_b = pq.read_table(train_a), pq.read_table(train_b)
    assert table_a.equals(table_b) and not table_a.equals(pq.read_table(train_c))
    prompts = lambda path: {r["prompt"][0]["content"] for r in pq.read_table(path).to_pylist()}
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


def test_tokenizer_round_trip_and_chat_template(tmp_path):
    save_tiny_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) < 128
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|im_end|>"
    ids = tok.encode("What is 1234-987?\n#### 247", add_special_tokens=False)
    assert tok.decode(ids) == "What is 1234-987?\n#### 247"
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens[4:8] == ["1", "2", "3", "4"] and "####" in tokens
    for digit in "0123456789":
        assert len(tok.encode(digit * 5, add_special_tokens=False)) == 5
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.decode(ids) == text


def test_synthetic_files_load_into_dataset(tmp_path):
    train, _ = write_synthetic_dataset(tmp_path, num_train=64, num_test=8, seed=0)
    ds = PromptDataset(train, build_tiny_tokenizer(), max_prompt_length=32)
    assert len(ds) == 64 and ds.num_dropped_too_long == 0
