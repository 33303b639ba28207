"""The weight channel (`verl_mp.bridge.transport`) between a sender and two receivers, on
gloo, next to (and independent of) the ranks' own torchrun world.

`benchmarks/weight_transfer.py --check` builds a small model of odd layer shapes (a
vocabulary of 3001 rows whose embedding is larger than a bucket), sends it in 0.1 MB
buckets, and each receiver keeps every view it got (as vLLM's reload may until a layer is
complete) and compares all of them bit for bit with tensors it regenerates (dtype included:
DeepSeek-V3's routing bias travels in fp32 buckets of its own in a bf16 model).
"""

import json
from pathlib import Path

import pytest

from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).resolve().parents[2] / "benchmarks" / "weight_transfer.py")


def test_buckets_arrive_bit_exact_at_every_receiver(tmp_path):
    out = tmp_path / "r.json"
    launch_local(PROG, 3, ["--small", "--gb", "0.004", "--bucket-mb", "0.1", "--dtype", "bf16", "--check",
                           "--iters", "1", "--out", out], module=False, timeout_s=240, capture_output=True)
    r = json.loads(out.read_text())
    assert r["ok"] and r["receivers"] == 2 and r["backend"] == "gloo"
    assert r["buckets"] > 10 and r["tensors"] > r["buckets"]  # several tensors per bucket, and many buckets
    assert [x["role"] for x in r["ranks"]] == ["sender", "receiver", "receiver"]
    # DeepSeek-V3's routing bias (one per layer) arrives in fp32 in a bf16 model, bit for bit
    assert all(x["fp32_received"] >= 2 for x in r["ranks"][1:]), r["ranks"]
