"""The planner's activation formula is what the engine's layer really saves.

tests/dist/progs/saved_activations.py (2 gloo ranks) counts the storages autograd saves in
one forward of a real megatron GPTModel layer built by the engine (sdpa layer spec), with
1 and 2 layers, for TP 1/2, sequence parallelism, bf16/fp32, q/k norm (Qwen3) and every
recompute setting, and for the GPU kernel path (fused RMSNorm and SwiGLU, run in Triton's CPU
interpreter). `verl_mp.planner.memory.layer_bytes_per_micro_batch` must give the same
bytes (measured: equal to the byte, except 4 bytes of RNG state under core_attn recompute).
It also proves the engine's recompute settings (actor.recompute, per role)
train the same model: fp32 gradients equal those without recompute.
"""

import json
from pathlib import Path

import pytest
import torch

from verl_mp.planner import memory as mem
from verl_mp.planner.dims import ModelDims
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "saved_activations.py")
CASES = {  # name -> (tp, sp, dtype, recompute granularity, modules, qk_norm, fused kernels), as in the prog
    "tp1": (1, False, "bf16", None, (), False, False),
    "tp1_fp32": (1, False, "fp32", None, (), False, False),
    "tp1_qk_norm": (1, False, "bf16", None, (), True, False),
    "tp1_selective_mlp": (1, False, "bf16", "selective", ("mlp",), False, False),
    "tp1_selective_core_attn": (1, False, "bf16", "selective", ("core_attn",), False, False),
    "tp1_full": (1, False, "bf16", "full", (), False, False),
    "tp2": (2, False, "bf16", None, (), False, False),
    "tp2_sp": (2, True, "bf16", None, (), False, False),
    "tp2_sp_full": (2, True, "bf16", "full", (), False, False),
    "tp1_kernels": (1, False, "bf16", None, (), False, True),
    "tp2_sp_kernels": (2, True, "bf16", None, (), False, True),
    "tp1_qk_norm_kernels": (1, False, "bf16", None, (), True, True),
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "res.json"
    # the fused cases run the Triton kernels in its CPU interpreter (on a GPU: the real ones)
    env = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    launch_local(PROG, 2, ["--out", out], module=False, timeout_s=300, capture_output=True, env=env)
    return json.loads(out.read_text())


def planned(res, tp, sp, dtype, granularity, modules, qk_norm, fused) -> float:
    s = res["shape"]
    dims = ModelDims(num_layers=1, hidden=s["hidden_size"], heads=s["num_attention_heads"],
                     kv_heads=s["num_query_groups"], head_dim=s["kv_channels"], ffn=s["ffn_hidden_size"],
                     vocab=s["vocab_size"], tied=True, qkv_bias=True, qk_norm=qk_norm)
    recompute = mem.Recompute(granularity=granularity, modules=modules)
    return mem.layer_bytes_per_micro_batch(dims, mem.DTYPE_BYTES[dtype], tp, sp, recompute, res["rows"], res["seq"],
                                           fused=fused)


@pytest.mark.parametrize("case", list(CASES))
def test_layer_bytes_match_formula(measured, case):
    got, want = measured["layer_bytes"][case], planned(measured, *CASES[case])
    print(f"{case}: measured {got} B, planned {want:.0f} B")
    assert got == pytest.approx(want, abs=16), case


def test_recompute_trains_the_same_model(measured):
    # fp32: recomputation re-runs the same ops, so gradients agree to rounding
    for case, diff in measured["grad_rel_diff"].items():
        assert diff <= 1e-6, (case, diff)
    # and it does save memory: selective MLP drops the SwiGLU term, full keeps one tensor
    layer = measured["layer_bytes"]
    assert layer["tp1_full"] < layer["tp1_selective_mlp"] < 0.6 * layer["tp1"]
