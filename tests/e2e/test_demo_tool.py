"""The multi-turn tool demo through the real CLI (preset tiny_tool_cpu, no model.path), cut to 8
GRPO steps with greedy held-out accuracy on 128 problems at steps 0, 4 and 8.

The warm start is built by the CLI in the background while earlier tests run
(tests/e2e/conftest.py; ~2 min on an idle core, 3-7 min on 2 busy cores), reused from
VERL_MP_CACHE if that names a cache holding it. The full run (20 steps, 256 held-out
problems) is in docs/agentic.md.
"""

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import run_cli, warm_start_records, warm_start_reused

pytestmark = pytest.mark.e2e


def test_tool_demo_learns_to_call_the_calculator(tmp_path, demo_warm_start, monkeypatch):
    cache = demo_warm_start("tiny_tool_cpu")
    monkeypatch.setenv("VERL_MP_CACHE", str(cache))
    built = warm_start_records(cache)
    out = tmp_path / "demo"
    run_cli(["--config-name", "tiny_tool_cpu", f"trainer.default_local_dir={out}", "trainer.total_steps=8",
             "trainer.save_final=false", "trainer.export_hf_at_end=false", "data.val_batch_size=128",
             "trainer.test_freq=4"], timeout=1200)
    warm_start_reused(out, cache, built)  # the CLI trained the warm start built for it, not another
    steps = {r["step"]: r for r in read_jsonl(str(out / "metrics.jsonl"))}
    assert set(steps) == set(range(9))
    # the warm start answers from memory (a 2-layer model cannot multiply 3-digit numbers)
    assert steps[0]["val/accuracy"] < 0.05 and steps[0]["val/multi_turn/tool_calls_per_conversation"] < 0.05
    # after 8 steps it calls the calculator and copies its answer (full run: 0% -> 91% at step 5)
    assert steps[8]["val/accuracy"] >= steps[0]["val/accuracy"] + 0.4, steps[8]["val/accuracy"]
    assert steps[8]["val/multi_turn/tool_call_success"] > 0.8
    first, last = steps[1], steps[8]
    assert last["rollout/multi_turn/tool_calls_per_conversation"] > first["rollout/multi_turn/tool_calls_per_conversation"]
    assert last["reward/called_tool/mean"] > first["reward/called_tool/mean"]  # the reward read the trajectory
    assert all(steps[s]["rollout/logprob_diff_max"] < 1e-4 for s in range(1, 9))
