"""The embedded demo through the real CLI (no model.path), shortened to 10 GRPO steps.

The warm start is built under a temporary cache (~2 min on 2 cores) unless VERL_MP_CACHE
names one that already holds it (then the test takes ~1.5 min).
"""

import os
from statistics import mean

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import longest_silence_s, run_cli

pytestmark = pytest.mark.e2e


def test_demo_reward_rises(tmp_path, tmp_path_factory, monkeypatch):
    cache = os.environ.get("VERL_MP_CACHE") or str(tmp_path_factory.mktemp("demo_cache"))
    monkeypatch.setenv("VERL_MP_CACHE", cache)
    out = tmp_path / "demo"
    proc = run_cli([f"trainer.default_local_dir={out}", "trainer.total_steps=10", "trainer.test_freq=5",
                    "trainer.save_final=false", "trainer.export_hf_at_end=false"])
    printed = (proc.stdout + proc.stderr).splitlines()
    assert len(printed) <= 60, "\n".join(printed)  # quiet by default, warm start included
    assert longest_silence_s(proc.stderr) <= 22, proc.stderr  # a line every 15 s (the warm start's too)
    steps = {r["step"]: r for r in read_jsonl(str(out / "metrics.jsonl"))}
    assert set(steps) == set(range(11))
    # The warm start ends most answers with a period, which arith_exact scores 0; GRPO
    # learns to stop after the number (full demo: 0.10 at step 1 -> 0.97 at step 30).
    first = mean(steps[s]["reward/score/mean"] for s in (1, 2))
    last = mean(steps[s]["reward/score/mean"] for s in (9, 10))
    assert last > first + 0.1, (first, last)
    assert "val/accuracy" in steps[0] and "val/accuracy" in steps[10]
    assert (out / "curves.png").stat().st_size > 0
    assert "reward/score/mean" in (out / "summary.md").read_text()
