"""benchmarks/peers/compare.py reads the systems' own logs as they wrote them on the GPU: the
verl 0.9.1 and verl_mp runs of 2026-12-06 (one H200, benchmarks/results/peers-2026-12-06-h200-verl-run/,
RESULTS.md "Fourth try"). The numbers it derives are checked against what each system printed or
logged itself, so a change of either log format or of the parser shows here, not in a table."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "results" / "peers-2026-12-06-h200-verl-run"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("peers_compare", ROOT / "benchmarks" / "peers" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verl_steps():
    return [json.loads(line) for line in (RUN / "verl" / "metrics.jsonl").read_text().splitlines()]


def test_verl_summary_matches_verls_own_counters(compare):
    s = compare.summarise(RUN / "verl")
    steps = _verl_steps()
    assert s["steps"] == 2 == len(steps)
    step2 = steps[1]["data"]
    # the steady state starts at step 2: with two steps, that step alone
    assert s["step_s"] == pytest.approx(step2["timing_s/step"]) == pytest.approx(92.339, abs=1e-3)
    # trained tokens (prompt + response, 64 x 8 samples) are verl's own global_seqlen/mean, within rounding
    trained = s["trained_tokens_per_s"] * s["step_s"]
    assert trained == pytest.approx(step2["global_seqlen/mean"], abs=1.0)
    assert s["gen_tokens_per_step"] == pytest.approx(step2["response_length/mean"] * 512)
    assert s["phases_s"] == pytest.approx({"sync": step2["timing_s/update_weights"],
                                           "old_logprob": step2["timing_s/old_log_prob"],
                                           "ref": step2["timing_s/ref"], "update": step2["timing_s/update_actor"]})
    # verl logs |d p|, not |d log p|: the table says "-" rather than a number it does not have
    assert s["lp_gap_max"] is None and s["lp_gap_mean"] is None
    assert s["p_gap_max"] == max(r["data"]["training/rollout_probs_diff_max"] for r in steps)
    assert s["peak_gpu_gib"] == pytest.approx(87.38, abs=0.01)


def test_verl_mp_summary_and_the_ratio(compare):
    base = compare.summarise(RUN / "verl_mp")
    rows = [json.loads(line) for line in (RUN / "verl_mp" / "metrics.jsonl").read_text().splitlines()]
    assert base["steps"] == 5 == len(rows)
    steady = sorted(r["timing/step_s"] for r in rows if r["step"] >= 2)
    assert base["step_s"] == pytest.approx((steady[1] + steady[2]) / 2)  # median of steps 2-5
    assert base["lp_gap_max"] == max(r["rollout/logprob_diff_max"] for r in rows)
    # the median over the 5 steps of each step's max: step 2's 0.0080 is the worst, not the typical step
    step_max = sorted(r["rollout/prob_diff_max"] for r in rows)
    assert base["p_gap_step_max_median"] == step_max[2] == pytest.approx(0.004534, abs=1e-6)
    assert base["p_gap_max"] == step_max[-1] == pytest.approx(0.008014, abs=1e-6)
    peer = compare.summarise(RUN / "verl")
    table = compare.table([base, peer])
    verl_row = next(line for line in table.splitlines() if line.startswith("| verl |"))
    ratio = base["trained_tokens_per_s"] / peer["trained_tokens_per_s"]
    assert ratio == pytest.approx(8.94, abs=0.01)
    assert verl_row.rstrip().endswith(f"| {ratio:.2f} |")
    assert "| 0.00421, 0.00444 / 0.00011 |" in verl_row  # verl's 2 steps: median of 0.00398 and 0.00444


def test_the_anchor_is_the_base_when_verl_mp_did_not_run_here(compare):
    """On a machine of their own, verl and the verl_mp anchor beside it: the ratio is against the anchor."""
    anchor = dict(compare.summarise(RUN / "verl_mp"), peer="verl_mp_anchor")
    peer = compare.summarise(RUN / "verl")
    verl_row = next(line for line in compare.table([anchor, peer]).splitlines() if line.startswith("| verl |"))
    assert verl_row.rstrip().endswith(f"| {anchor['trained_tokens_per_s'] / peer['trained_tokens_per_s']:.2f} |")


def test_a_folder_without_a_run_is_left_out(compare, tmp_path):
    assert compare.summarise(tmp_path) is None
