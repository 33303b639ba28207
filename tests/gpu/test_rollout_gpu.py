"""On the GPU machine with CUDA vLLM 0.26: Megatron and vLLM colocated in the same
processes hand device memory over with sleep/wake, sync after an update, and agree on
per-token log-probs within bf16 tolerance (1 GPU; TP=2 on 2 GPUs when present).

Training TP == rollout TP here, so the ``local`` sync runs (rank-local shards copied into
vLLM's parameters); after it, vLLM's own loader is fed the ``gather`` sync's full HF
tensors and must build exactly the same parameters (difference 0)."""

import json
import os

import pytest
import torch

from verl_mp.utils.launch import launch_local

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROG = "verl_mp.cli.rank_verify_rollout"
# bf16: two different kernel stacks (megatron SDPA vs vLLM flash attention) round
# differently; a layout bug moves log-probs by O(1), rounding by O(1e-2).
BF16_MAX, BF16_MEAN = 0.25, 0.02
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LAYOUTS = [(1, 1, 1), (2, 1, 2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("gpu") / "m", hidden_size=256, num_heads=4,
                           num_kv_heads=2, intermediate_size=512, dtype=torch.bfloat16)


@pytest.mark.parametrize("tp,pp,rtp", LAYOUTS, ids=[f"tp{t}pp{p}rtp{r}" for t, p, r in LAYOUTS])
def test_colocated_sync_bf16(model_dir, tmp_path, tp, pp, rtp):
    world = max(tp * pp, rtp)
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    out = tmp_path / "r.json"
    launch_local(PROG, world, ["--model", model_dir, "--tp", tp, "--pp", pp, "--rollout-tp", rtp,
                               "--dtype", "bf16", "--bucket-mb", 64, "--sync-mode", "local", "--out", out],
                 module=True,
                 timeout_s=500, env={**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VLLM"))}})
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["before_gap"] <= BF16_MAX and r["after_gap"] <= BF16_MAX, r
    assert r["mean_gap_after"] <= BF16_MEAN, r
    assert r["changed"] > 5 * r["mean_gap_after"], r  # the update arrived
    assert r["asleep_gb"] < r["before_sleep_gb"] - 1.0, r  # sleeping freed the KV cache and weights
    assert r["sync_mode"] == "local" and r["local_vs_loader_max_abs_diff"] == 0.0, r
    assert r["direct_copy"] or tp > 1, r  # one rank: the in-place copy (WeightSync.copy_into) ran


def test_colocated_sync_after_sleep_level_2(model_dir, tmp_path):
    """``rollout.sleep_level=2``: vLLM drops its weights while Megatron trains (nothing is copied
    to the CPU and back) and the sync must rewrite every one of them. Caught if not: the
    snapshot of vLLM's parameters after the local sync must equal what vLLM's own loader
    builds, and the log-probs must agree."""
    out = tmp_path / "r.json"
    launch_local(PROG, 1, ["--model", model_dir, "--dtype", "bf16", "--bucket-mb", 64, "--sync-mode", "local",
                           "--sleep-level", 2, "--out", out], module=True,
                 timeout_s=500, env={**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VLLM"))}})
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["after_gap"] <= BF16_MAX and r["mean_gap_after"] <= BF16_MEAN, r
    assert r["changed"] > 5 * r["mean_gap_after"], r
    assert r["local_vs_loader_max_abs_diff"] == 0.0, r
    assert r["direct_copy"], r  # the in-place copy (WeightSync.copy_into) ran, not the bucketed stream


def test_colocated_sync_keeping_the_weights(model_dir, tmp_path):
    """``rollout.keep_weights_on_gpu``: only the KV cache is released while Megatron trains
    (the project's own release: vLLM's sleep has no such level). The KV cache's memory must
    come free, the kept weights must score the first samples as before, and the in-place sync
    must then give what vLLM's own loader builds."""
    out = tmp_path / "r.json"
    launch_local(PROG, 1, ["--model", model_dir, "--dtype", "bf16", "--bucket-mb", 64, "--sync-mode", "local",
                           "--keep-weights", "--out", out], module=True,
                 timeout_s=500, env={**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VLLM"))}})
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["asleep_gb"] < r["before_sleep_gb"] - 10.0, r  # the KV cache (~40 GiB at utilization 0.3) came free
    assert r["kept_weights_gap"] <= BF16_MAX, r
    assert r["after_gap"] <= BF16_MAX and r["mean_gap_after"] <= BF16_MEAN, r
    assert r["changed"] > 5 * r["mean_gap_after"], r
    assert r["local_vs_loader_max_abs_diff"] == 0.0, r
    assert r["direct_copy"], r  # the in-place copy (WeightSync.copy_into) ran, not the bucketed stream


MOE_LAYOUTS = [  # (TP, EP, expert-TP, vLLM expert parallelism): training layout == vLLM's expert layout
    (1, 1, 1, False),  # one GPU: every expert whole on both sides
    (2, 2, 1, True),  # two GPUs: each rank copies its 2 of 4 experts into vLLM's expert-parallel slots
    (2, 1, 2, False),  # two GPUs: every expert split in two on both sides
]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from verl_mp.demo.tiny_models import save_tiny_moe

    return save_tiny_moe(tmp_path_factory.mktemp("gpu_moe") / "m", hidden_size=256, moe_intermediate_size=256,
                         dtype=torch.bfloat16)


@pytest.mark.parametrize("tp,ep,etp,rollout_ep", MOE_LAYOUTS, ids=[f"tp{t}ep{e}etp{k}{'_vllm_ep' * r}"
                                                                   for t, e, k, r in MOE_LAYOUTS])
def test_moe_local_sync_bf16(moe_dir, tmp_path, tp, ep, etp, rollout_ep):
    """Mixture of experts (needs the vLLM kit built with KEEP_MOE=1): the local sync copies each
    expert into its slot of vLLM's fused w13/w2 parameters; vLLM's own loader fed the gather
    sync's per-expert HF tensors must build the same parameters, and log-probs agree."""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    out = tmp_path / "r.json"
    launch_local(PROG, tp, ["--model", moe_dir, "--tp", tp, "--ep", ep, "--etp", etp, "--rollout-tp", tp,
                            "--dtype", "bf16", "--bucket-mb", 64, "--sync-mode", "local", "--out", out]
                 + (["--rollout-ep"] if rollout_ep else []), module=True,
                 timeout_s=500, env={**ENV, **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VLLM"))}})
    r = json.loads(out.read_text())
    print(json.dumps(r))
    assert r["sync_mode"] == "local" and r["local_vs_loader_max_abs_diff"] == 0.0, r
    assert r["direct_copy"] or tp > 1, r
    assert r["before_gap"] <= BF16_MAX and r["after_gap"] <= BF16_MAX, r
    assert r["mean_gap_after"] <= BF16_MEAN and r["changed"] > 5 * r["mean_gap_after"], r
