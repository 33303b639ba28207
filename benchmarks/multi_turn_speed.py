"""Generation speed of multi-turn rollouts against single-turn generation of as many tokens.

One `VLLMRollout` (the project's colocated engine, one process, one GPU or CPU) generates for
the same prompts (a) multi-turn conversations: every turn that ends at a stop token calls the
calculator (`always_calls`), up to ``--turns`` assistant turns of at most ``--turn-tokens``
each; then (b) single-turn responses whose token budget is the multi-turn run's mean model
tokens per conversation (same engine, the multi-turn layer switched off), so both produce
about the same number of tokens; and (c) single-turn responses matched sample by sample:
each sample generates exactly as many tokens as its conversation's model tokens in the last
multi-turn run (``ignore_eos``, one request per sample through the same engine). (b) has no
length spread, so its step count is the mean length while the conversations' is their
longest: the gap between (b) and (c) is the workload's spread, the gap between (c) and the
multi-turn run is what the turns themselves cost (turn boundaries, tool calls, prefilling
the tool responses). Random weights write random text: ``--stop`` token ids end
a turn (about ``len(stop) / vocabulary`` per token). Each case: one warm-up call, then the
median of ``--repeats``; model tokens/s (tool tokens are not counted), and for the multi-turn
case turns/s, the engine's idle fraction and its steps; ``--admit-every 1,4,16`` times the
multi-turn case at each `MultiTurnConfig.admit_every_steps`. ``--cudagraph-max-tokens`` is
``rollout.cudagraph_max_tokens`` (default: the planner's choice for this workload,
`verl_mp.planner.choose.graph_tokens`; 0: vLLM's own 512); the result records the range vLLM
took and the engine's start-up seconds. ``--multi-only`` times the multi-turn case alone;
``--logprobs-too`` each admit case again with the sampler's log-probs (as the GRPO loop runs);
``--tool-response-tokens`` and ``--max-total-tokens`` set the GRPO loop's 64 and 1152 (the
defaults, 16 and 64 + turns x (turn tokens + 40), are this benchmark's earlier workload);
``--profile`` runs the first and last admit case once more under torch.profiler recording the
GPU only (its busy time, kernels by kind; compare the busy time with the case's unprofiled
seconds: is a step the GPU's time or the host's?); ``--host-profile`` the first admit case and the
matched single-turn case once more under cProfile (where the host's time goes, by function).

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/multi_turn_speed.py \\
        --model DIR [--size 0.5b] --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from verl_mp.reward.tool_parser import ToolCall

BODY = {"tiny": dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),
        "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
        "1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, intermediate_size=8960)}


def always_calls(text: str) -> list[ToolCall]:
    """Every turn calls the calculator (the benchmark's tool-call parser)."""
    return [ToolCall("calculator", {"expression": f"{len(text)}*7"})]


def make_model(path: str, size: str, max_pos: int, dtype: str) -> str:
    import torch

    from verl_mp.demo.tiny_models import save_tiny_qwen2

    if not (Path(path) / "config.json").exists():
        save_tiny_qwen2(path, num_kv_heads=2, max_position_embeddings=max_pos,
                        dtype=torch.bfloat16 if dtype == "bf16" else torch.float32, **BODY[size])
    return path


def prompts(num: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(3, 250) for _ in range(rng.randrange(16, 48))] for _ in range(num)]


def matched_single_turn(rollout, batch: list[list[int]], multi_out, n: int) -> int:
    """One single-turn request per sample, each generating exactly its conversation's model
    tokens in ``multi_out`` (the engine's own ``generate``; no log-probs, as the multi-turn
    case). Returns the tokens generated."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    budgets = [sum(mask) for mask in multi_out.response_masks]
    # no per-request seeds, as the multi-turn case (seed_scope=batch): vLLM samples a batch of seeded
    # requests one by one in a Python loop
    params = [SamplingParams(max_tokens=max(1, k), min_tokens=max(1, k), ignore_eos=True, temperature=1.0)
              for k in budgets]
    requests = [TokensPrompt(prompt_token_ids=list(batch[i // n])) for i in range(len(budgets))]
    outs = rollout.llm.generate(requests, params, use_tqdm=False)
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == sum(max(1, k) for k in budgets), (produced, sum(budgets))
    return produced


def timed(fn, repeats: int) -> list[tuple[float, object]]:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        runs.append((time.perf_counter() - start, out))
    return runs


def admit_case(runs: list[tuple[float, object]]) -> dict:
    """One multi-turn case's entry in ``multi_turn_by_admit_every``: the median rate, each run's
    seconds and model tokens, the last run's engine steps and admissions."""
    last = runs[-1][1].metrics
    return {"tokens_per_s": statistics.median(out.num_generated_tokens / s for s, out in runs),
            "seconds": [round(s, 3) for s, _ in runs], "engine_steps": last["rollout/multi_turn/engine_steps"],
            "model_tokens": [out.num_generated_tokens for _, out in runs],
            "admissions": last["rollout/multi_turn/engine_admissions"]}


def profiled(rollout, batch, sampling, admit_every: int) -> dict:
    """One multi-turn run under torch.profiler: its wall seconds, the GPU's busy milliseconds by
    kernel kind and the top kernels (against the case's unprofiled seconds: is a step's time the
    GPU's or the host's?)."""
    import torch

    rollout.turns.cfg.multi_turn.admit_every_steps = admit_every
    # on a GPU only the device's activity: recording every CPU op would slow the host-heavy loop it measures
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available()
                                              else torch.profiler.ProfilerActivity.CPU])
    with prof:
        start = time.perf_counter()
        out = rollout.generate(batch, sampling)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    from verl_mp.utils.profiling import summarize

    averages = prof.key_averages()
    summary = summarize(averages)
    sort = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return {"wall_s": round(wall, 3), "model_tokens": out.num_generated_tokens,
            "engine_steps": out.metrics["rollout/multi_turn/engine_steps"],
            "device_busy_ms": round(summary["device_ms_total"], 1), "device_ms_by_kind": summary["device_ms_by_kind"],
            "top": averages.table(sort_by=sort, row_limit=25)}


def host_profiled(fn) -> dict:
    """``fn()`` once under cProfile (the host's Python: this process runs vLLM's engine core
    in-process): wall seconds, and the top functions by own time, then by cumulative time
    (`verl_mp.utils.profiling.host_table`, as ``trainer.profile.host`` writes them)."""
    import cProfile

    from verl_mp.utils.profiling import host_table

    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    out = fn()
    prof.disable()
    wall = time.perf_counter() - start
    return {"wall_s": round(wall, 3), "tokens": out if isinstance(out, int) else out.num_generated_tokens,
            "table": host_table(prof, 50)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="model directory (made here if it has no config.json)")
    p.add_argument("--size", default="0.5b", choices=tuple(BODY))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (rollout.sampling.n)")
    p.add_argument("--turns", type=int, default=4, help="rollout.multi_turn.max_turns")
    p.add_argument("--turn-tokens", type=int, default=256, help="rollout.sampling.max_new_tokens (per turn)")
    p.add_argument("--stop", default="5,6,7", help="stop token ids (comma-separated) that end a turn")
    p.add_argument("--tool-response-tokens", type=int, default=16,
                   help="rollout.multi_turn.max_tool_response_tokens (the GRPO loop's default: 64)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="rollout.multi_turn.max_total_tokens and max_model_len (default: 64 + turns x "
                   "(turn tokens + 40); gpu_session's GRPO loop: 1152)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--admit-every", default="1", help="rollout.multi_turn.admit_every_steps values (comma-separated): "
                   "the multi-turn case at each; the first is the one compared with single-turn")
    p.add_argument("--cudagraph-max-tokens", type=int, default=None,
                   help="rollout.cudagraph_max_tokens (default: the planner's choice; 0: vLLM's own)")
    p.add_argument("--multi-only", action="store_true", help="only the multi-turn case (no single-turn baselines)")
    p.add_argument("--logprobs-too", action="store_true",
                   help="also each admit case with rollout log-probs on (the sampler's, as the training loop runs)")
    p.add_argument("--profile", action="store_true",
                   help="one more multi-turn run at the first and the last admit value under torch.profiler: wall "
                   "seconds against the GPU's busy time and its kernels by kind (in the result's 'profile')")
    p.add_argument("--host-profile", action="store_true",
                   help="the first admit case and the matched single-turn case once more under cProfile: the host's "
                   "top functions by own and cumulative time (in the result's 'host_profile'; printed to stderr)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from verl_mp.config.rollout import MultiTurnConfig, RolloutConfig, SamplingConfig
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.planner.choose import graph_tokens
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    stop = [int(t) for t in a.stop.split(",") if t]
    total = a.max_total_tokens or 64 + a.turns * (a.turn_tokens + 40)
    make_model(a.model, a.size, max(total, 512), a.dtype)
    init_distributed()
    mt = MultiTurnConfig(enable=True, max_turns=a.turns, max_total_tokens=total,
                         max_tool_response_tokens=a.tool_response_tokens, tools=["calculator"],
                         tool_parser="benchmarks.multi_turn_speed:always_calls", tool_num_workers=4)
    graphs = a.cudagraph_max_tokens if a.cudagraph_max_tokens is not None else graph_tokens(a.prompts * a.samples, True)
    cfg = RolloutConfig(dtype=a.dtype, max_model_len=total, sleep_level=1, multi_turn=mt,
                        gpu_memory_utilization=a.gpu_memory_utilization, cudagraph_max_tokens=graphs)
    started = time.perf_counter()
    rollout = VLLMRollout(cfg, a.model, num_kv_heads=2)
    start_s = time.perf_counter() - started
    compilation = rollout.llm.llm_engine.vllm_config.compilation_config
    engine = {"cudagraph_max_tokens": graphs, "start_s": round(start_s, 1),
              "vllm_max_cudagraph_capture_size": compilation.max_cudagraph_capture_size,
              "vllm_cudagraph_mode": str(compilation.cudagraph_mode)}
    batch = prompts(a.prompts)
    sampling = SamplingConfig(n=a.samples, max_new_tokens=a.turn_tokens, logprobs=False, seed=7, stop_token_ids=stop)
    admit = [int(k) for k in a.admit_every.split(",") if k]
    by_admit = {}
    for k in admit:
        rollout.turns.cfg.multi_turn.admit_every_steps = k
        runs = timed(lambda: rollout.generate(batch, sampling), a.repeats)
        by_admit[k] = admit_case(runs)
        if k == admit[0]:
            multi = runs
    for k in admit if a.logprobs_too else ():
        rollout.turns.cfg.multi_turn.admit_every_steps = k
        by_admit[f"{k}+logprobs"] = admit_case(timed(lambda: rollout.generate(batch, replace(sampling, logprobs=True)),
                                                     a.repeats))
    profiles = {k: profiled(rollout, batch, sampling, k) for k in dict.fromkeys((admit[0], admit[-1]))} \
        if a.profile else {}
    rollout.turns.cfg.multi_turn.admit_every_steps = admit[0]
    tokens = [out.num_generated_tokens for _, out in multi]
    last = multi[-1][1].metrics
    result = {
        "size": a.size, "dtype": a.dtype, "prompts": a.prompts, "n": a.samples, "turns": a.turns,
        "turn_tokens": a.turn_tokens, "tool_response_tokens": a.tool_response_tokens, "max_total_tokens": total,
        "stop": stop, "engine": engine,
        "multi_turn": {"model_tokens": tokens, "seconds": [round(s, 3) for s, _ in multi],
                       "tokens_per_s": statistics.median(out.num_generated_tokens / s for s, out in multi),
                       "turns_per_s": last["rollout/multi_turn/turns_per_s"],
                       "turns_per_conversation": last["rollout/multi_turn/turns_per_conversation"],
                       "truncated": last["rollout/multi_turn/truncated"],
                       "engine_idle_frac": last["rollout/multi_turn/engine_idle_frac"],
                       "engine_busy_frac": last["rollout/multi_turn/engine_busy_frac"],
                       "engine_steps": last["rollout/multi_turn/engine_steps"],
                       "prefix_cached_frac": last["rollout/multi_turn/engine_prefix_cached_frac"],
                       "tool_latency_mean_s": last["rollout/multi_turn/tool_latency_mean_s"]},
        "multi_turn_by_admit_every": by_admit,
    }
    if profiles:
        result["profile"] = profiles
    if a.host_profile:
        import sys

        rollout.turns.cfg.multi_turn.admit_every_steps = admit[0]
        host = {"multi_turn": host_profiled(lambda: rollout.generate(batch, sampling))}
        turns, rollout.turns = rollout.turns, None
        host["single_turn_matched"] = host_profiled(lambda: matched_single_turn(rollout, batch, multi[-1][1], a.samples))
        rollout.turns = turns
        result["host_profile"] = host
        for name, h in host.items():
            print(f"== host profile: {name}: {h['tokens']} tokens in {h['wall_s']} s\n{h['table']}", file=sys.stderr,
                  flush=True)
    if not a.multi_only:
        per_sample = statistics.median(tokens) / (a.prompts * a.samples)
        mt_rate = result["multi_turn"]["tokens_per_s"]
        result.update(single_turn_cases(rollout, batch, multi[-1][1], per_sample, mt_rate, a))
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    rollout.close()
    os._exit(0)  # vLLM's in-process engine has no clean shutdown


def single_turn_cases(rollout, batch, multi_out, per_sample: float, mt_rate: float, a) -> dict:
    """The single-turn baselines on the same engine: at the multi-turn run's mean budget
    (``per_sample`` model tokens) and matched sample by sample to ``multi_out`` (its last run);
    their rates and the ratio of the multi-turn case's rate ``mt_rate`` to each."""
    from verl_mp.config.rollout import SamplingConfig

    turns = rollout.turns
    rollout.turns = None  # the same engine, single-turn: one response per sample of as many tokens
    single_sampling = SamplingConfig(n=a.samples, max_new_tokens=max(1, math.ceil(per_sample)), logprobs=False, seed=7)
    single = timed(lambda: rollout.generate(batch, single_sampling), a.repeats)
    matched = timed(lambda: matched_single_turn(rollout, batch, multi_out, a.samples), a.repeats)
    rollout.turns = turns
    single_rate = statistics.median(out.num_tokens / s for s, out in single)
    matched_rate = statistics.median(n / s for s, n in matched)
    return {
        "single_turn": {"max_new_tokens": single_sampling.max_new_tokens,
                        "tokens": [out.num_tokens for _, out in single],
                        "seconds": [round(s, 3) for s, _ in single], "tokens_per_s": single_rate},
        "single_turn_matched": {"tokens": [n for _, n in matched], "seconds": [round(s, 3) for s, _ in matched],
                                "engine_steps_at_least": max(sum(m) for m in multi_out.response_masks),
                                "tokens_per_s": matched_rate},
        "ratio": mt_rate / single_rate, "ratio_matched": mt_rate / matched_rate,
    }


if __name__ == "__main__":
    main()
