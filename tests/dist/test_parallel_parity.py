"""Megatron on CPU/gloo: the same tiny GPT trained at every (TP, PP, DP) layout gives the
same losses and gradient norms as the single-rank run (fp32, 3 DistributedOptimizer steps)."""

import json
from pathlib import Path

import pytest

from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "train_parity.py")
LAYOUTS = [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1)]  # (TP, PP, DP)


def run_layout(tmp: Path, tp: int, pp: int, dp: int, save_init: bool = False) -> dict:
    out = tmp / f"tp{tp}_pp{pp}_dp{dp}.json"
    args = ["--tp", tp, "--pp", pp, "--init-ckpt", tmp / "init", "--out", out]
    launch_local(PROG, tp * pp * dp, args + (["--save-init"] if save_init else []),
                 module=False, timeout_s=300, capture_output=True)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parity")
    return tmp, run_layout(tmp, 1, 1, 1, save_init=True)


@pytest.mark.parametrize("tp,pp,dp", LAYOUTS, ids=[f"tp{t}pp{p}dp{d}" for t, p, d in LAYOUTS])
def test_layout_matches_single_rank(reference, tp, pp, dp):
    tmp, ref = reference
    got = run_layout(tmp, tp, pp, dp)
    assert got["dp"] == dp
    assert len(got["losses"]) == len(ref["losses"]) == 3
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert abs(a - b) <= 1e-5, (got["losses"], ref["losses"])
    for a, b in zip(got["grad_norms"], ref["grad_norms"], strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (got["grad_norms"], ref["grad_norms"])
    # the optimizer really stepped: losses of different steps differ
    assert len(set(round(x, 6) for x in got["losses"])) == 3
