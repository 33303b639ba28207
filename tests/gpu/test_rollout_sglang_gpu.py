"""``rollout.backend=sglang`` on the GPU machine (not yet run: the SGLang kit is
scripts/gpu-sglang/; docs/rollout.md says what it needs). One GPU, rollout TP1:

- parity: after a real optimizer step and the ``gather`` sync, SGLang's per-token log-probs
  match the trainer's within the vLLM backend's bf16 tolerance (tests/gpu/test_rollout_gpu.py);
- sleep/wake: sleeping frees device memory (weights and KV cache, at both sleep levels) and
  waking takes it back;
- speed: SGLangRollout.generate runs at >= 0.9x a bare ``sglang.Engine`` on the same prompts
  (log-probs on in both).
Programs: tests/gpu/progs/sglang_rollout.py (one torchrun rank)."""

import json
import os
from pathlib import Path

import pytest
import torch

from verl_mp.rollout.sglang_compat import sglang_blocker
from verl_mp.utils.launch import launch_local

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(torch.cuda.is_available() and sglang_blocker(True) is not None,
                                 reason="needs sglang 0.5.17 (scripts/gpu-sglang)")]

PROG = str(Path(__file__).parent / "progs" / "sglang_rollout.py")
BF16_MAX, BF16_MEAN = 0.25, 0.02  # as the vLLM backend's (tests/gpu/test_rollout_gpu.py)
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _env():
    return {**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "SGLANG", "LD_"))}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("gpu") / "m", hidden_size=256, num_heads=4,
                           num_kv_heads=2, intermediate_size=512, dtype=torch.bfloat16)


@pytest.mark.parametrize("level", [2, 1])
def test_sglang_parity_after_sync_and_sleep(model_dir, tmp_path, level):
    out = tmp_path / "r.json"
    launch_local(PROG, 1, ["--model", model_dir, "--mode", "parity", "--sleep-level", level, "--out", out],
                 module=False, timeout_s=500, env=_env())
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["sync_mode"] == "gather", r
    assert r["before_gap"] <= BF16_MAX and r["after_gap"] <= BF16_MAX and r["mean_gap_after"] <= BF16_MEAN, r
    assert r["changed"] > 5 * r["mean_gap_after"], r  # the step moved the model by more than the gap
    assert r["asleep_gib"] < r["awake_gib"] - 1.0, r  # sleeping freed the KV cache and the weights
    assert r["rewoken_gib"] > r["asleep_gib"] + 1.0, r


def test_sglang_rollout_speed_vs_sglang_alone(tmp_path):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    model = save_tiny_qwen2(tmp_path / "m05", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                            intermediate_size=4864, dtype=torch.bfloat16)  # the Qwen2-0.5B body
    out = tmp_path / "s.json"
    launch_local(PROG, 1, ["--model", model, "--mode", "speed", "--out", out], module=False, timeout_s=500, env=_env())
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["ratio"] >= 0.9, r
