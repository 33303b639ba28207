"""One table for the peer benchmark: each system's run of the same GRPO job side by side.

    python benchmarks/peers/compare.py RESULTS_DIR [--json OUT.json]

RESULTS_DIR holds one folder per system as `run.sh PEER RESULTS_DIR/PEER` writes it (verl_mp,
verl, trl). Per system: steps completed, the median over steps 2.. of the step time, generated
tokens per step and their rate over the generation phase, trained tokens (prompt + response) per
second of step, the phases each system logs, peak device memory (nvidia-smi, the whole GPU), the
rollout-vs-trainer gap as each logs it (|d log p| for verl_mp and TRL, |d p| for verl_mp and verl; the
median over steps of each step's max beside the worst step's, since runs differ in steps),
and verl_mp's step throughput over each peer's.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PEERS = ("verl_mp", "verl_mp_defaults", "verl_mp_anchor", "verl", "trl")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _rows_verl_mp(d: Path, samples: int) -> list[dict]:
    rows = []
    for m in _jsonl(d / "metrics.jsonl"):
        if "timing/step_s" not in m:
            continue
        resp, prompt = m.get("response_length/mean", 0.0), m.get("prompt_length/mean", 0.0)
        rows.append({
            "step": m.get("training/step"), "step_s": m["timing/step_s"], "gen_s": m.get("timing/generate_s"),
            "gen_tokens": resp * samples, "trained_tokens": (resp + prompt) * samples,
            "phases": {"sync": m.get("timing/weight_sync_s"), "old_logprob": m.get("timing/old_log_prob_s"),
                       "ref": m.get("timing/ref_s"), "update": m.get("timing/update_actor_s")},
            "lp_gap_max": m.get("rollout/logprob_diff_max"), "lp_gap_mean": m.get("rollout/logprob_diff_mean"),
            "p_gap_max": m.get("rollout/prob_diff_max"), "p_gap_mean": m.get("rollout/prob_diff_mean"),
        })
    return rows


def _rows_verl(d: Path, samples: int) -> list[dict]:
    rows = []
    for line in _jsonl(d / "metrics.jsonl"):
        m = line.get("data", line)
        if "timing_s/step" not in m:
            continue
        resp, prompt = m.get("response_length/mean", 0.0), m.get("prompt_length/mean", 0.0)
        rows.append({
            "step": line.get("step"), "step_s": m["timing_s/step"], "gen_s": m.get("timing_s/gen"),
            "gen_tokens": resp * samples, "trained_tokens": (resp + prompt) * samples,
            "phases": {"sync": m.get("timing_s/update_weights"), "old_logprob": m.get("timing_s/old_log_prob"),
                       "ref": m.get("timing_s/ref"), "update": m.get("timing_s/update_actor")},
            "lp_gap_max": None, "lp_gap_mean": None,
            "p_gap_max": m.get("training/rollout_probs_diff_max"), "p_gap_mean": m.get("training/rollout_probs_diff_mean"),
        })
    return rows


def _rows_trl(d: Path, samples: int) -> list[dict]:
    rows, seen = [], 0.0
    for r in _jsonl(d / "steps.jsonl"):
        m, ph = r["metrics"], r["phases_s"]
        total = m.get("num_tokens", 0.0)  # cumulative prompt + completion tokens
        rows.append({
            "step": r["step"], "step_s": r["step_s"], "gen_s": ph.get("generate"),
            "gen_tokens": m.get("completions/mean_length", 0.0) * samples, "trained_tokens": total - seen,
            "phases": {"sync": ph.get("weight_sync"), "old_logprob+ref": ph.get("score"), "update": ph.get("train")},
            "lp_gap_max": m.get("sampling/sampling_logp_difference/max"),
            "lp_gap_mean": m.get("sampling/sampling_logp_difference/mean"),
            "p_gap_max": None, "p_gap_mean": None,
        })
        seen = total
    return rows


READERS = {"verl_mp": _rows_verl_mp, "verl_mp_defaults": _rows_verl_mp, "verl_mp_anchor": _rows_verl_mp,
           "verl": _rows_verl, "trl": _rows_trl}


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _peak_mem_gib(d: Path) -> float | None:
    path = d / "gpu_mem.csv"
    if not path.exists():
        return None
    vals = [float(x) for x in path.read_text().split() if x.strip().replace(".", "").isdigit()]
    return max(vals) / 1024 if vals else None


def summarise(d: Path) -> dict | None:
    job_path = d / "job.json"
    if not job_path.exists():
        return None
    job = json.loads(job_path.read_text())
    samples = job["prompts"] * job["n"]
    rows = READERS[job["peer"]](d, samples)
    steady = [r for r in rows if r["step"] is not None and r["step"] >= 2] or rows
    step_s = _med(r["step_s"] for r in steady)
    gen_tokens = _med(r["gen_tokens"] for r in steady)
    gen_s = _med(r["gen_s"] for r in steady)
    trained = _med(r["trained_tokens"] / r["step_s"] for r in steady if r["step_s"])
    phases = {}
    for r in steady:
        for k, v in r["phases"].items():
            phases.setdefault(k, []).append(v)
    wall = json.loads((d / "wall.json").read_text())["wall_s"] if (d / "wall.json").exists() else None
    return {
        "peer": job["peer"], "job": job, "steps": len(rows), "wall_s": wall, "step_s": step_s,
        "gen_s": gen_s, "gen_tokens_per_step": gen_tokens,
        "gen_tokens_per_s": _med(r["gen_tokens"] / r["gen_s"] for r in steady if r["gen_s"]),
        "trained_tokens_per_s": trained,
        "samples_per_s": samples / step_s if step_s else None,
        "phases_s": {k: _med(v) for k, v in phases.items()},
        "peak_gpu_gib": _peak_mem_gib(d),
        "lp_gap_max": max((r["lp_gap_max"] for r in rows if r["lp_gap_max"] is not None), default=None),
        "lp_gap_step_max_median": _med(r["lp_gap_max"] for r in rows),
        "lp_gap_mean": _med(r["lp_gap_mean"] for r in rows),
        "p_gap_max": max((r["p_gap_max"] for r in rows if r["p_gap_max"] is not None), default=None),
        "p_gap_step_max_median": _med(r["p_gap_max"] for r in rows),
        "p_gap_mean": _med(r["p_gap_mean"] for r in rows),
    }


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _gap(s: dict, kind: str) -> str:
    step_max, worst, mean = s[f"{kind}_gap_step_max_median"], s[f"{kind}_gap_max"], s[f"{kind}_gap_mean"]
    if step_max is None and mean is None:
        return "-"
    return f"{_fmt(step_max, '.3g')}, {_fmt(worst, '.3g')} / {_fmt(mean, '.2g')}"


def table(summaries: list[dict]) -> str:
    # the ratio's base: verl_mp's tuned run, or its anchor run beside a peer on a machine of their own
    base = next((s for s in summaries if s["peer"] == "verl_mp"), None) or next(
        (s for s in summaries if s["peer"] == "verl_mp_anchor"), None)
    # the gap's max is an extreme over every token of a step: the median over steps of each step's max compares
    # runs of different step counts; the worst step follows it
    head = ("| system | steps | step s (median 2..) | generated tok/step | generate s | generated tok/s | "
            "trained tok/s | phases s (median) | peak GPU GiB | \\|d log p\\| max (median step, worst) / mean | "
            "\\|d p\\| max (median step, worst) / mean | verl_mp step throughput / this |")
    lines = [head, "|" + "---|" * 12]
    for s in summaries:
        ratio = (base["trained_tokens_per_s"] / s["trained_tokens_per_s"]
                 if base and s["trained_tokens_per_s"] and base["trained_tokens_per_s"] else None)
        # a phase a system did not run is left out (verl_mp's old-log-prob pass with one optimizer step a step)
        phases = ", ".join(f"{k} {_fmt(v, '.2f')}" for k, v in s["phases_s"].items() if v is not None)
        lines.append(
            f"| {s['peer']} | {s['steps']} | {_fmt(s['step_s'], '.2f')} | {_fmt(s['gen_tokens_per_step'], ',.0f')} | "
            f"{_fmt(s['gen_s'], '.2f')} | {_fmt(s['gen_tokens_per_s'], ',.0f')} | {_fmt(s['trained_tokens_per_s'], ',.0f')} | "
            f"{phases} | {_fmt(s['peak_gpu_gib'], '.1f')} | {_gap(s, 'lp')} | {_gap(s, 'p')} | {_fmt(ratio, '.2f')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(args.results)
    summaries = [s for p in PEERS if (s := summarise(root / p)) is not None]
    if not summaries:
        raise SystemExit(f"compare.py: no run.sh results (job.json) under {root}/{{{','.join(PEERS)}}}")
    print(table(summaries))
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
