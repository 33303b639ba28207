"""The named tensors ``rollout.backend=sglang`` feeds to SGLang's ``update_weights_from_tensor``,
built from real Megatron shards on CPU (gloo) at TP=2 and PP=2, equal the HF checkpoint's
tensors bit for bit (tests/dist/progs/sglang_batches.py). SGLang itself runs on CUDA only
(docs/rollout.md); what it does with them is tests/gpu/test_rollout_sglang_gpu.py's. Also: SGLang's
scheduler processes, spawned from a torchrun rank, form their own process group
(tests/dist/progs/sglang_spawn.py)."""

import json
from pathlib import Path

import pytest

from verl_mp.demo.tiny_models import build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "sglang_batches.py")
ARCHS = ("qwen2", "llama")  # tied embeddings with QKV bias; untied with llama3 rope scaling


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang_batches")
    for kind in ARCHS:
        build_tiny_checkpoint(kind, root / kind)
    return root


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_sglang_batches_equal_checkpoint(models, tmp_path, tp, pp):
    out = tmp_path / "r.json"
    launch_local(PROG, tp * pp, ["--tp", tp, "--pp", pp, "--models", models, "--archs", ",".join(ARCHS),
                                 "--out", out], module=False, timeout_s=300, capture_output=True)
    results = json.loads(out.read_text())
    for arch in ARCHS:
        for rank, row in enumerate(results[arch]):
            assert row["names_equal"] and row["bit_equal"] and row["names_once"], (arch, rank, row)
            assert row["full_batches"] and row["num_batches"] > 1, (arch, rank, row)


def test_sglang_schedulers_form_their_own_group_under_torchrun(tmp_path):
    """SGLang's schedulers are spawned processes that form their own ``tcp://`` process group.
    Under torchrun they inherit ``TORCHELASTIC_USE_AGENT_STORE`` and wait as clients of a store
    nobody serves (the first GPU run's silent 480 s hang, 2026-12-06); ``engine_start_env`` starts
    them without it and gives the rank its environment back."""
    out = tmp_path / "r.json"
    launch_local(str(Path(__file__).parent / "progs" / "sglang_spawn.py"), 1, [str(out)], module=False, timeout_s=180)
    r = json.loads(out.read_text())
    assert r["agent_store_in_rank"] == "True", r  # torchrun's environment, as the trainer's ranks have it
    assert r["plain_exit"] != 0, r  # the trap: the plain child times out in its rendezvous
    assert r["inside_exit"] == 0, r
    assert r["agent_store_after"] == "True", r
