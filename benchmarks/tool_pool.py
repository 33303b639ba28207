"""Tool-call latency and throughput of the multi-turn rollout's tool pool (`ToolPool`), driven
as the rollout drives it: one `poll(0)` per engine step, new calls submitted in bursts as
turns end.

An engine step is simulated by ``time.sleep(--step-ms)`` (an engine step on the GPU: the
0.5B body at 512 conversations took ~10 ms on an H100, 2026-12-06). ``--bursts`` times, ``--burst``
calls (the calculator) are submitted at once, one burst every ``--every`` steps; the run ends
when every call is back. Prints one JSON line: calls/s, mean/p50/max latency (submit to
`poll` returning it), steps.

    python benchmarks/tool_pool.py --workers 4 --step-ms 10 --burst 128 --bursts 8 --every 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from verl_mp.reward.tool_pool import ToolPool
from verl_mp.reward.tools import resolve_tools


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--burst", type=int, default=128)
    p.add_argument("--bursts", type=int, default=8)
    p.add_argument("--every", type=int, default=20, help="engine steps between bursts")
    a = p.parse_args()
    calc = resolve_tools(["calculator"])["calculator"]
    pool = ToolPool(a.workers, timeout_s=10.0)
    pool.start()
    time.sleep(2.0)  # the workers' interpreters start
    pool.poll(0.0)
    latencies, submitted, steps = [], 0, 0
    start = time.perf_counter()
    while submitted < a.burst * a.bursts or pool.in_flight:
        if steps % a.every == 0 and submitted < a.burst * a.bursts:
            for i in range(a.burst):
                pool.submit(submitted + i, calc, {"expression": f"{submitted + i}*7"})
            submitted += a.burst
        time.sleep(a.step_ms / 1000)
        steps += 1
        for _, result in pool.poll(0.0):
            assert result.status == "ok", result
            latencies.append(result.seconds)
    wall = time.perf_counter() - start
    pool.close()
    print(json.dumps({"workers": a.workers, "step_ms": a.step_ms, "calls": len(latencies), "steps": steps,
                      "wall_s": round(wall, 3), "calls_per_s": round(len(latencies) / wall, 1),
                      "latency_mean_s": round(statistics.mean(latencies), 4),
                      "latency_p50_s": round(statistics.median(latencies), 4),
                      "latency_max_s": round(max(latencies), 4)}))


if __name__ == "__main__":
    main()
