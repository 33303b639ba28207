"""The GPU demo preset (``demo_gpu``) resolves, plans and passes preflight for one H200
without building anything; every DemoSettings field is part of the demo's cache key."""

import dataclasses
import json

import pytest

from verl_mp.config.loader import load_config
from verl_mp.demo import warm_start as demo
from verl_mp.demo.warm_start import DEMO_PRESETS, GPU_DEMO, DemoSettings

pytestmark = pytest.mark.unit

H200_GIB = 140.4  # what the driver reports for an H200


def test_demo_gpu_preset_resolves_without_building(tmp_path, monkeypatch):
    from verl_mp.cli.train import demo_config

    cfg = load_config("demo_gpu", [])
    assert DEMO_PRESETS["demo_gpu"] is GPU_DEMO and GPU_DEMO.vocab_size == 151936
    assert (cfg.model.dtype, cfg.trainer.launcher, cfg.trainer.nproc) == ("bf16", "torchrun", 1)
    assert cfg.rollout.gpu_memory_utilization == 0.4 and cfg.rollout.logprob_gap_freq == 5
    assert not cfg.trainer.export_hf_at_end and (cfg.trainer.total_steps, cfg.trainer.test_freq) == (30, 5)
    assert cfg.data.val_batch_size == GPU_DEMO.num_test  # validation covers the whole held-out split
    config = json.loads((demo.write_demo_model_config(tmp_path / "cfg", GPU_DEMO) / "config.json").read_text())
    assert (config["vocab_size"], config["tie_word_embeddings"], config["hidden_size"] // config["num_attention_heads"]) \
        == (151936, True, 64)
    monkeypatch.setenv("VERL_MP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "_cached", lambda record, model_dir: True)  # resolve only: no warm start
    resolved = demo_config(cfg, "demo_gpu")
    key = demo.demo_key(GPU_DEMO)
    assert resolved.model.path == str(tmp_path / "cache" / f"demo-{key}" / "sft_model")
    assert resolved.trainer.default_local_dir == f"outputs/demo/demo-{key}"
    assert key != demo.demo_key(DemoSettings())


def test_demo_gpu_plan_fits_an_h200(capsys):
    from verl_mp.cli import main as cli_main

    assert cli_main(["plan", "--config-name", "demo_gpu", "--gpu-memory-gib", str(H200_GIB)]) == 0
    out = capsys.readouterr().out
    assert "model 0.17B params" in out and "-> fits" in out, out


def test_the_moe_demo_plans_without_a_model_path(capsys):
    from verl_mp.cli import main as cli_main

    assert cli_main(["plan", "--config-name", "tiny_moe_cpu", "--gpu-memory-gib", "80"]) == 0
    assert "-> fits" in capsys.readouterr().out


def test_demo_gpu_passes_preflight_with_its_tokenizer(tmp_path):
    """The trainer's preflight (layouts, batch sizes, lengths, the data tokenized with the
    padded 151,936-entry tokenizer, and the memory planner for an H200) accepts the preset."""
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tokenizer import save_tiny_tokenizer
    from verl_mp.trainer.setup import preflight

    model_dir = demo.write_demo_model_config(tmp_path / "model", GPU_DEMO)
    save_tiny_tokenizer(model_dir, vocab_size=GPU_DEMO.vocab_size)
    train, test = write_synthetic_dataset(tmp_path / "data", num_train=64, num_test=16, max_digits=3,
                                          second_digits=1)
    cfg = load_config("demo_gpu", [f"model.path={model_dir}", f"data.train_files=[{train}]",
                                   f"data.val_files=[{test}]", f"trainer.gpu_memory_gib={H200_GIB}"])
    preflight(cfg)


def test_gpu_demo_refuses_to_warm_start_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match="CUDA is not available here"):
        demo.build_demo(tmp_path / "demo", GPU_DEMO)
    assert not (tmp_path / "demo" / "data").exists()  # refused before any work
    with pytest.raises(ValueError, match="sft_device='tpu'"):
        DemoSettings(sft_device="tpu")


def test_every_setting_is_part_of_the_cache_key():
    changed = {"hidden_size": 256, "vocab_size": 4096, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 384,
               "tie_word_embeddings": True, "sft_warmup_steps": 5, "sft_device": "cuda", "sft_dtype": "bf16"}
    base = DemoSettings()
    keys = {demo.demo_key(base)}
    for f in dataclasses.fields(DemoSettings):
        value = changed.get(f.name, getattr(base, f.name))
        if value == getattr(base, f.name):  # the fields of the first demo: any other value
            value = value + 1 if isinstance(value, int) else value * 0.5
        keys.add(demo.demo_key(dataclasses.replace(base, **{f.name: value})))
    assert len(keys) == len(dataclasses.fields(DemoSettings)) + 1
