"""End-of-run report from ``metrics.jsonl``: ``curves.png`` and ``summary.md``.

Records logged for the same step (e.g. a resumed run re-logging steps after its last
checkpoint, or validation logged in its own call) are merged, later values winning.
``null`` values (NaN/inf in the tracker) are treated as missing. "Best" is the minimum
for keys containing ``loss`` and the maximum otherwise. ``val/accuracy`` is taken as
a fraction, so its change is reported in percentage points (x100).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from verl_mp.trainer.tracking import read_jsonl

logger = logging.getLogger(__name__)

DEFAULT_CURVES = ("reward/score/mean", "val/accuracy")
VAL_ACCURACY_KEY = "val/accuracy"
STEP_TIME_KEY = "timing/step_s"


def merge_by_step(records: list[dict]) -> list[dict]:
    """One record per step, sorted by step; later records override earlier keys."""
    merged: dict[int, dict] = {}
    for record in records:
        if "step" not in record:
            raise ValueError(f"metrics record without a 'step' key: {record}")
        merged.setdefault(int(record["step"]), {}).update(record)
    return [merged[step] for step in sorted(merged)]


def curve_points(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the merged records, skipping missing/null values."""
    points = [(r["step"], float(r[key])) for r in records if r.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def summarize_curve(steps: list[int], values: list[float], key: str) -> dict[str, float]:
    """first/last/best value of one curve and the steps where they occur."""
    pick = min if "loss" in key else max
    best_index = pick(range(len(values)), key=values.__getitem__)
    return {
        "first": values[0], "last": values[-1], "best": values[best_index],
        "first_step": steps[0], "last_step": steps[-1], "best_step": steps[best_index],
    }


def summarize(records: list[dict], curves: Sequence[str]) -> dict:
    """Summary numbers: one dict per available curve, plus run-level totals."""
    summary: dict = {}
    for key in curves:
        steps, values = curve_points(records, key)
        if values:
            summary[key] = summarize_curve(steps, values, key)
    trained = [r["step"] for r in records if r.get("step", 0) >= 1]  # step 0: validation before training
    summary["num_steps"] = len(trained)
    if trained:
        summary["steps"] = (min(trained), max(trained))
    step_times_s = curve_points(records, STEP_TIME_KEY)[1]
    if step_times_s:
        summary["total_time_s"] = sum(step_times_s)
    if VAL_ACCURACY_KEY not in summary:
        steps, values = curve_points(records, VAL_ACCURACY_KEY)
        if values:
            summary[VAL_ACCURACY_KEY] = summarize_curve(steps, values, VAL_ACCURACY_KEY)
    if VAL_ACCURACY_KEY in summary:
        acc = summary[VAL_ACCURACY_KEY]
        summary["val_accuracy_gain_pp"] = 100.0 * (acc["last"] - acc["first"])
    return summary


def _format_duration(seconds: float) -> str:
    """``1h 02m 03s`` / ``2m 03s`` / ``4.5s``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def render_markdown(summary: dict, curves: Sequence[str]) -> str:
    """summary.md text: a first/last/best table, totals, the val accuracy change."""
    lines = ["# Training summary", ""]
    rows = [key for key in curves if key in summary]
    if rows:
        lines += ["| metric | first | last | best |", "|---|---|---|---|"]
        for key in rows:
            c = summary[key]
            lines.append(
                f"| {key} | {c['first']:.4g} (step {c['first_step']}) "
                f"| {c['last']:.4g} (step {c['last_step']}) "
                f"| {c['best']:.4g} (step {c['best_step']}) |"
            )
        lines.append("")
    span = f" (steps {summary['steps'][0]}-{summary['steps'][1]})" if "steps" in summary else ""
    lines.append(f"- training steps: {summary['num_steps']}{span}")
    if summary.get("stopped"):
        lines.append(f"- interrupted: {stopped_line(summary)}")
    if "total_time_s" in summary:
        lines.append(f"- time in training steps: {_format_duration(summary['total_time_s'])} (start-up, "
                     "validation and checkpoints not counted)")
    if "wall_time_s" in summary:
        lines.append(f"- wall time of the last invocation: {_format_duration(summary['wall_time_s'])}")
    if "val_accuracy_gain_pp" in summary:
        acc = summary[VAL_ACCURACY_KEY]
        lines.append(
            f"- val accuracy: {acc['first']:.4f} -> {acc['last']:.4f} "
            f"({summary['val_accuracy_gain_pp']:+.1f} pp)"
        )
    return "\n".join(lines) + "\n"


def stopped_line(summary: dict) -> str:
    """``stopped at step 3 of 8 (Ctrl-C or SIGTERM); resume_mode=auto continues``."""
    last = summary["steps"][1] if "steps" in summary else 0
    of = f" of {summary['total_steps']}" if summary.get("total_steps") else ""
    return f"stopped at step {last}{of} (Ctrl-C or SIGTERM); trainer.resume_mode=auto continues from its checkpoint"


def console_summary(summary: dict, out_dir: str) -> str:
    """The run's last console line, for a person: what it did, how long, where the report is
    (the numbers in full: summary.md, metrics.jsonl)."""
    last = summary["steps"][1] if "steps" in summary else 0
    total = summary.get("total_steps")
    head = f"stopped at step {last} of {total}" if summary.get("stopped") else f"done: step {last}"
    if total and not summary.get("stopped"):
        head += f" of {total}"
    parts = [head]
    if "wall_time_s" in summary:
        parts.append(f"in {_format_duration(summary['wall_time_s'])}")
    text = " ".join(parts)
    if VAL_ACCURACY_KEY in summary:
        acc = summary[VAL_ACCURACY_KEY]
        text += f"; val accuracy {100 * acc['first']:.1f}% -> {100 * acc['last']:.1f}%"
    elif "reward/score/mean" in summary:
        score = summary["reward/score/mean"]
        text += f"; reward {score['first']:.3g} -> {score['last']:.3g}"
    return f"{text}; report: {os.path.join(out_dir, 'summary.md')}"


def plot_curves(records: list[dict], curves: Sequence[str], path: str) -> None:
    """One subplot per curve that has data, value vs step, saved as a PNG (Agg canvas).

    Uses ``Figure`` + ``FigureCanvasAgg`` directly, so pyplot's global backend is untouched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    available = [(key, *curve_points(records, key)) for key in curves]
    available = [item for item in available if item[2]]
    fig = Figure(figsize=(7, 2.6 * max(1, len(available))), layout="constrained")
    FigureCanvasAgg(fig)
    if not available:
        fig.text(0.5, 0.5, "no data for: " + ", ".join(curves), ha="center", va="center")
    axes = fig.subplots(len(available), 1, squeeze=False)[:, 0] if available else []
    for ax, (key, steps, values) in zip(axes, available, strict=True):
        sparse = key.startswith("val/") or len(values) < 30
        ax.plot(steps, values, marker="o" if sparse else None, markersize=4)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    fig.savefig(path, dpi=100)


def write_report(
    metrics_jsonl: str, out_dir: str, curves: Sequence[str] = DEFAULT_CURVES, wall_time_s: float | None = None,
    total_steps: int | None = None, stopped: bool = False,
) -> dict:
    """Write ``<out_dir>/curves.png`` and ``<out_dir>/summary.md``; return the summary.

    Returns e.g. ``{"val/accuracy": {"first", "last", "best", "*_step"}, "num_steps",
    "total_time_s" (when timing/step_s was logged), "val_accuracy_gain_pp"}``, plus
    ``total_steps`` and ``stopped`` (a run stopped on request) when given.
    """
    records = merge_by_step(read_jsonl(metrics_jsonl))
    os.makedirs(out_dir, exist_ok=True)
    summary = summarize(records, curves)
    if wall_time_s is not None:
        summary["wall_time_s"] = wall_time_s
    if total_steps is not None:
        summary["total_steps"] = total_steps
    if stopped:
        summary["stopped"] = True  # on request (Ctrl-C, SIGTERM): summary.md says where
    plot_curves(records, curves, os.path.join(out_dir, "curves.png"))
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(summary, curves))
    logger.info("wrote report to %s", out_dir)
    return summary
