"""Print a GRPO run's per-step table from its metrics.jsonl: time per phase with its
throughput, and device memory per phase (the memory/* metrics, GiB).

    python benchmarks/grpo_table.py RUN_DIR/metrics.jsonl
"""

import json
import sys

COLUMNS = [("step", "training/step", "{:.0f}"), ("step s", "timing/step_s", "{:.1f}"),
           ("gen s", "timing/generate_s", "{:.1f}"), ("gen tok/s", "timing/generate_tokens_per_s", "{:.0f}"),
           ("old lp s", "timing/old_log_prob_s", "{:.1f}"), ("ref s", "timing/ref_s", "{:.1f}"),
           ("update s", "timing/update_actor_s", "{:.1f}"), ("sync s", "timing/weight_sync_s", "{:.2f}"),
           ("TFLOP/s/dev", "perf/tflops_per_s_per_device", "{:.0f}"), ("MFU", "perf/mfu", "{:.1%}"),
           ("sync GB/s", "rollout/sync_gbps", "{:.1f}"),
           ("lp gap max", "rollout/logprob_diff_max", "{:.3f}"), ("lp gap mean", "rollout/logprob_diff_mean", "{:.4f}"),
           ("clipfrac", "actor/clipfrac", "{:.4f}"),
           ("free@wake", "memory/generate/awake_free_gib", "{:.1f}"),
           ("peak fwd", "memory/forward/peak_allocated_gib", "{:.1f}"),
           ("peak upd", "memory/update/peak_allocated_gib", "{:.1f}"),
           ("rsv before gen", "memory/generate/before_reserved_gib", "{:.1f}"),
           ("round trips", "perf/driver_round_trips", "{:.0f}"), ("sent MB", "perf/driver_sent_mb", "{:.1f}")]


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(" | ".join(name for name, _, _ in COLUMNS))
    for row in rows:
        if "timing/step_s" not in row:
            continue
        cells = []
        for _, key, fmt in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else fmt.format(value))
        print(" | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
