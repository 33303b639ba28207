"""Compare GRPO runs phase by phase: the median over the steps after the first (step 1 carries
start-up work: Triton JIT, the reward pool's start) of each phase's seconds, and of the
driver <-> worker traffic, with each run's ratio to the first run.

    python benchmarks/grpo_compare.py torchrun=RUN_A/metrics.jsonl ray=RUN_B/metrics.jsonl
"""

import json
import statistics
import sys

PHASES = [("step s", "timing/step_s"), ("generate s", "timing/generate_s"),
          ("gen tok/s", "timing/generate_tokens_per_s"), ("old log-prob s", "timing/old_log_prob_s"),
          ("ref s", "timing/ref_s"), ("update s", "timing/update_actor_s"), ("sync s", "timing/weight_sync_s"),
          ("driver round trips", "perf/driver_round_trips"), ("driver sent MB", "perf/driver_sent_mb")]


def medians(path: str) -> tuple[dict[str, float], int]:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r for r in rows if "timing/step_s" in r and r.get("training/step", r.get("step", 0)) > 1]
    if not steps:
        raise SystemExit(f"{path}: no step after the first (run at least 2 steps)")
    out = {}
    for name, key in PHASES:
        values = [r[key] for r in steps if r.get(key) is not None]
        if values:
            out[name] = statistics.median(values)
    return out, len(steps)


def main(args: list[str]) -> None:
    runs = []
    for arg in args:
        label, sep, path = arg.partition("=")
        if not sep:
            raise SystemExit(f"argument {arg!r}: expected LABEL=PATH/metrics.jsonl")
        runs.append((label, *medians(path)))
    base = runs[0][1]
    header = ["phase (median of steps 2..n)"] + [f"{label} ({n} steps)" for label, _, n in runs]
    print(" | ".join(header))
    for name, _ in PHASES:
        cells = [name]
        for i, (_, values, _) in enumerate(runs):
            v = values.get(name)
            if v is None:
                cells.append("-")
            elif i and base.get(name):
                cells.append(f"{v:.3g} ({v / base[name]:.3f}x)")
            else:
                cells.append(f"{v:.3g}")
        print(" | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
