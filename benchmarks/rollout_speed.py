"""Generation speed: vLLM on its own vs the project's rollout engine, same model, batch, GPU.

Modes (run each in a process of its own: two vLLM engines do not share a process well):
- ``standalone``: ``vllm.LLM.generate`` with the rollout's engine settings, without
  per-token log-probs (``no_logprobs``), with vLLM's own (``logprobs``: ``logprobs=0``), and
  with the sampler's (``sampler_logprobs``: patches/vllm_sampled_logprobs.py, the rollout's
  default), whose values are also checked against vLLM's ``logprobs=0`` on one batch
  (``sampler_vs_vllm``: max |difference| and the share of bit-identical values);
- ``project``: `VLLMRollout.generate` without log-probs, with the sampler's (the default,
  ``logprobs``) and with vLLM's objects (``logprobs_vllm``, ``rollout.logprobs_source=vllm``),
  and right after a ``sleep()`` + ``wake_up()`` (what every training step does).
Each case: one warm-up call, then the median of ``--repeats`` calls; generated tokens/s. The
prompts are random token ids, or with ``--data`` the first batch a GRPO run on that file draws.
The loop's own generate phase is `timing/generate_tokens_per_s` of a GRPO run
(benchmarks/gpu_session.sh runs one).

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/rollout_speed.py \
        --mode standalone --model DIR --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
"""vLLM's dtype name -> the rollout config's."""
BODY = {"0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
        "1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, intermediate_size=8960),
        "tiny": {}}  # save_tiny_qwen2's defaults (hidden 128, 2 layers): for CPU runs


def make_model(path: str, size: str) -> str:
    """A random Qwen2 body with the project's tiny tokenizer (bf16)."""
    import torch

    from verl_mp.demo.tiny_models import save_tiny_qwen2

    if not (Path(path) / "config.json").exists():
        save_tiny_qwen2(path, num_kv_heads=2, max_position_embeddings=2048, dtype=torch.bfloat16, **BODY[size])
    return path


def prompts(num: int, data: str | None = None, model: str | None = None) -> list[list[int]]:
    """``num`` prompts: random token ids (16-47 each), or with ``data`` (a training parquet file)
    the first batch a GRPO run on it draws (the run's default data seed and shuffle, its
    prompt length 64 of benchmarks/gpu_grpo.sh), chat-templated with ``model``'s tokenizer as
    the run does: the loop's step 1 and vLLM alone then generate for the same prompts."""
    if data is None:
        import random

        rng = random.Random(0)
        return [[rng.randrange(3, 250) for _ in range(rng.randrange(16, 48))] for _ in range(num)]
    from verl_mp.config.schema import DataConfig
    from verl_mp.data.dataset import PromptDataset
    from verl_mp.data.sampler import ResumableBatchSampler
    from verl_mp.data.tokenizer import load_tokenizer

    dataset = PromptDataset(data, load_tokenizer(model), max_prompt_length=64)
    defaults = DataConfig()
    first = ResumableBatchSampler(len(dataset), num, seed=defaults.seed, shuffle=defaults.shuffle).next_batch()
    return dataset.get_batch(first).input_ids


TIMES: dict[str, list[dict]] = {}
"""Every timed call of every case (tokens, seconds): the spread between repeats is part of the result."""


def timed(cases: dict, repeats: int, warmup=None) -> dict[str, float]:
    """Median tokens/s of each case (name -> call returning its generated tokens) over ``repeats``
    rounds, the cases interleaved within each round (a machine whose load drifts slows them
    alike), after one warm-up call each (``warmup(fn)``: e.g. on a smaller batch, when the full
    one takes minutes). `TIMES` also keeps each call's CPU seconds (this process, all threads):
    on a shared CPU machine they count the work that other processes' load hides in wall time."""
    for fn in cases.values():
        (warmup or (lambda f: f()))(fn)
    runs = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = fn()
            runs[name].append((time.perf_counter() - start, tokens, time.process_time() - cpu_start))
    for name, rs in runs.items():
        TIMES[name] = [{"tokens": t, "seconds": round(s, 3), "tokens_per_s": round(t / s, 1), "cpu_seconds": round(c, 3),
                        "tokens_per_cpu_s": round(t / c, 1)} for s, t, c in rs]
    return {name: statistics.median(t / s for s, t, _ in rs) for name, rs in runs.items()}


def standalone(a) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_mp.patches import vllm_sampled_logprobs

    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=a.max_new_tokens + 64, seed=0,
              gpu_memory_utilization=a.gpu_memory_utilization, logprobs_mode="processed_logprobs",
              enforce_eager=a.enforce_eager)
    out = {"runner": vllm_sampled_logprobs.install(llm)}
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts(a.prompts, a.data, a.model)]
    cases = {}
    for name, logprobs in (("no_logprobs", None), ("logprobs", 0), ("sampler_logprobs", None)):
        if name not in a.cases.split(","):
            continue
        params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_new_tokens, logprobs=logprobs, seed=None,
                                detokenize=a.detokenize)

        def run(params=params, prompts=batch, name=name):
            if name != "sampler_logprobs":
                outs = llm.generate(prompts, params, use_tqdm=False)
            else:  # the rollout's path: record, then cut per sample
                with vllm_sampled_logprobs.capture() as cap:
                    outs = llm.generate(prompts, params, use_tqdm=False)
                cap.logprobs(outs)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

        cases[name] = run
    out.update(timed(cases, a.repeats, warmup=lambda run: run(prompts=batch[:a.warmup_prompts])))
    if "sampler_logprobs" in a.cases.split(","):
        out["sampler_vs_vllm"] = sampler_vs_vllm(llm, batch[:a.warmup_prompts or 32], a)
    return out


def sampler_vs_vllm(llm, batch, a) -> dict:
    """One generate call with vLLM's ``logprobs=0`` while the shim records: the same sampled
    tokens, so the two log-probs are compared token by token."""
    from vllm import SamplingParams

    from verl_mp.patches import vllm_sampled_logprobs

    params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_new_tokens, logprobs=0, detokenize=False)
    with vllm_sampled_logprobs.capture() as cap:
        outs = llm.generate(batch, params, use_tqdm=False)
    diffs = [abs(entry[tok].logprob - lp)
             for o, per_sample in zip(outs, cap.logprobs(outs), strict=True)
             for c, lps in zip(o.outputs, per_sample, strict=True)
             for tok, entry, lp in zip(c.token_ids, c.logprobs, lps, strict=True)]
    return {"tokens": len(diffs), "max_abs_diff": max(diffs), "bit_identical_frac": sum(d == 0 for d in diffs) / len(diffs)}


def project(a) -> dict:
    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    init_distributed()
    cfg = RolloutConfig(dtype=DTYPES[a.dtype], max_model_len=a.max_new_tokens + 64, sleep_level=1,  # generates after
                        gpu_memory_utilization=a.gpu_memory_utilization,  # a sleep with no sync: the weights must stay
                        enforce_eager=a.enforce_eager)
    rollout = VLLMRollout(cfg, a.model, num_kv_heads=2)
    batch = prompts(a.prompts, a.data, a.model)

    def case(logprobs: bool, from_sampler: bool):
        sampling = SamplingConfig(n=a.n, max_new_tokens=a.max_new_tokens, logprobs=logprobs, seed=7)

        def run():
            rollout.sampler_logprobs = from_sampler  # False: rollout.logprobs_source=vllm
            return rollout.generate(batch, sampling).num_tokens

        return run

    out = timed({"no_logprobs": case(False, True), "logprobs": case(True, True), "logprobs_vllm": case(True, False)},
                a.repeats)
    rollout.sampler_logprobs = True
    sampling = SamplingConfig(n=a.n, max_new_tokens=a.max_new_tokens, logprobs=False, seed=7)

    def after_wake():
        rollout.sleep()
        rollout.wake_up()
        start = time.perf_counter()
        tokens = rollout.generate(batch, sampling).num_tokens
        return tokens, time.perf_counter() - start

    runs = [after_wake() for _ in range(a.repeats)]
    out["no_logprobs_after_wake"] = runs[0][0] / statistics.median(r[1] for r in runs)
    rollout.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("standalone", "project"), required=True)
    p.add_argument("--model", required=True, help="model directory (made here if it has no config.json)")
    p.add_argument("--size", default="0.5b", choices=tuple(BODY))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default="no_logprobs,logprobs,sampler_logprobs",
                   help="standalone: which of no_logprobs,logprobs,sampler_logprobs")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES), help="float32 on CPU")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs / compile (set on CPU)")
    p.add_argument("--detokenize", action="store_true", help="standalone: vLLM decodes the outputs (and every "
                   "log-prob's token); the rollout asks for token ids only")
    p.add_argument("--data", default=None, help="a training parquet file: its first GRPO batch as the prompts "
                   "(default: random token ids)")
    p.add_argument("--warmup-prompts", type=int, default=None, help="standalone: warm up on this many prompts (all)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    make_model(a.model, a.size)
    result = {"mode": a.mode, "prompts": a.prompts, "n": a.n, "max_new_tokens": a.max_new_tokens,
              "tokens_per_s": standalone(a) if a.mode == "standalone" else project(a)}
    result["runs"] = TIMES
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    os._exit(0)  # vLLM's in-process engine has no clean shutdown


if __name__ == "__main__":
    main()
