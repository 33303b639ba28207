"""Two gloo ranks at TP=2, padded vocabulary, temperature 0.7 (tests/dist/progs/engine_kernel.py):
the engine's log-prob op with either implementation (torch, or the fused Triton kernel in the
CPU interpreter) matches fp64 log_softmax incl. the gradient of log-prob + entropy terms, and
the engine's log-probs, entropy and actor-loss gradients are the same with both (the switch
also covers the decoder layers' RMSNorm and SwiGLU; the norm weights' gradients are compared
on their own as well)."""

import json
from pathlib import Path

import pytest
import torch

from verl_mp.kernels.dispatch import triton_available
from verl_mp.demo.tiny_models import build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(not triton_available(), reason="needs triton"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                       reason="2 ranks: the CPU, or 2 GPUs"),
]

PROG = str(Path(__file__).parent / "progs" / "engine_kernel.py")


def test_kernel_path_matches_torch_at_tp2(tmp_path):
    model = build_tiny_checkpoint("llama", tmp_path / "llama")  # vocab 101: padded to 102
    out = tmp_path / "res.json"
    env = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    launch_local(PROG, 2, ["--tp", 2, "--model", model, "--out", out], module=False, timeout_s=300,
                 env=env, capture_output=True)
    res = json.loads(out.read_text())
    print(json.dumps(res))
    for impl, err in res["op_errors"].items():
        assert max(err["log_prob"], err["entropy"], err["grad"]) <= 1e-5, (impl, err)
        assert err["padded_grad_max"] == 0, (impl, err)
    assert res["padded_vocab"] > res["vocab_size"]
    # fp32 on both paths: only the summation order differs
    diff = res["triton_vs_torch"]
    assert diff["log_prob_diff"] <= 1e-5 and diff["entropy_diff"] <= 1e-5, diff
    assert diff["grad_rel_l2"] <= 1e-5, diff
    assert diff["norm_grad_rel_l2"] <= 1e-5, diff  # the fused RMSNorm's dw, on its own
    torch_m, triton_m = res["torch_metrics"], res["triton_metrics"]
    for key in ("pg_loss", "entropy", "grad_norm"):
        assert triton_m[key] == pytest.approx(torch_m[key], rel=1e-5, abs=1e-7), key
