"""write_report: curves.png and summary.md from a synthetic metrics.jsonl."""

import json

import pytest

from verl_mp.trainer.report import merge_by_step, write_report

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def synthetic_run(num_steps=20):
    """Score rising 0.1 -> 0.1 + 0.02*(n-1); val every 5 steps (own record); 2 s/step."""
    records = []
    for step in range(1, num_steps + 1):
        records.append({"step": step, "reward/score/mean": 0.1 + 0.02 * (step - 1),
                        "timing/step_s": 2.0, "actor/pg_loss": 1.0 / step})
        if step % 5 == 0 or step == 1:
            records.append({"step": step, "val/accuracy": 0.40 + 0.01 * step})
    return records


def test_report_png_summary_and_numbers(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    write_jsonl(jsonl, synthetic_run())
    summary = write_report(str(jsonl), str(tmp_path / "report"))
    png = (tmp_path / "report" / "curves.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 1000
    score = summary["reward/score/mean"]
    assert score["first"] == pytest.approx(0.1) and score["last"] == pytest.approx(0.48)
    assert score["best"] == pytest.approx(0.48) and score["best_step"] == 20
    acc = summary["val/accuracy"]
    assert (acc["first"], acc["last"], acc["first_step"]) == pytest.approx((0.41, 0.60, 1))
    assert summary["num_steps"] == 20
    assert summary["total_time_s"] == pytest.approx(40.0)
    assert summary["val_accuracy_gain_pp"] == pytest.approx(19.0)
    text = (tmp_path / "report" / "summary.md").read_text()
    assert "| reward/score/mean | 0.1 (step 1) | 0.48 (step 20) | 0.48 (step 20) |" in text
    assert "- training steps: 20 (steps 1-20)" in text and "- time in training steps: 40.0s" in text
    assert "val accuracy: 0.4100 -> 0.6000 (+19.0 pp)" in text


def test_loss_best_is_min_and_missing_curves_skipped(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    write_jsonl(jsonl, synthetic_run(4))
    summary = write_report(
        str(jsonl), str(tmp_path), curves=("actor/pg_loss", "critic/vf_loss")
    )
    assert summary["actor/pg_loss"]["best"] == pytest.approx(0.25)
    assert "critic/vf_loss" not in summary
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_SIGNATURE


def test_no_curve_data_still_writes_report(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    write_jsonl(jsonl, [{"step": 1, "other": 1.0}, {"step": 2, "reward/score/mean": None}])
    summary = write_report(str(jsonl), str(tmp_path), wall_time_s=63.0)
    assert summary == {"num_steps": 2, "steps": (1, 2), "wall_time_s": 63.0}
    assert "- wall time of the last invocation: " in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "val accuracy" not in (tmp_path / "summary.md").read_text()


def test_merge_by_step_resumed_run_later_wins():
    records = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 2, "a": 5.0, "b": 1.0}]
    assert merge_by_step(records) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 5.0, "b": 1.0}]
