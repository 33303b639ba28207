"""Ray single-controller mode on a GPU (issue 22): the real CLI with `trainer.launcher=ray`
for 2 GRPO steps of a tiny model. Each rank actor gets the GPU placement gave it
(CUDA_VISIBLE_DEVICES), forms its NCCL group inside the actor, hands device memory to vLLM
and back (sleep/wake) and syncs weights under Ray; after the run no process holds the GPU.

Run on the GPU machine with the Ray kit installed (benchmarks/gpu_session.sh launchers).
"""

import json
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_grpo_under_ray_on_one_gpu(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    model = save_tiny_qwen2(tmp_path / "model", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                            intermediate_size=512, dtype=torch.bfloat16)
    train, test = write_synthetic_dataset(tmp_path / "data", num_train=64, num_test=8)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "verl_mp", "train", "--config-name", "grpo", f"model.path={model}",
           "model.dtype=bf16", f"data.train_files=[{train}]", f"data.val_files=[{test}]",
           "trainer.launcher=ray", "trainer.nproc=1", "trainer.total_steps=2", "trainer.test_freq=0",
           "rollout.gpu_memory_utilization=0.3", "rollout.max_model_len=256", "data.max_prompt_length=64",
           "rollout.sampling.max_new_tokens=32", "rollout.val_sampling.max_new_tokens=32",
           f"trainer.default_local_dir={out}", "trainer.export_hf_at_end=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    workers = json.loads((out / "workers.json").read_text())["actor_rollout_ref"]
    assert workers["backend"] == "nccl" and workers["device"] == "cuda:0"
    assert workers["visible_devices"] not in (None, "")  # Ray gave the actor its GPU
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = {r["step"]: r for r in rows}[2]
    assert step["rollout/logprob_diff_max"] < 0.5  # bf16 rollout vs trainer after the sync under Ray
    assert step["memory/generate/awake_free_gib"] > 0 and "memory/generate/before_free_gib" in step
    used = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    assert not used, f"processes still hold the GPU after the run: {used}"
