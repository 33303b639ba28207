"""Generation speed: vLLM on its own vs the project's rollout engine, same model, batch, GPU.

Modes (run each in a process of its own: two vLLM engines do not share a process well):
- ``standalone``: ``vllm.LLM.generate`` with the rollout's engine settings, without and
  with per-token log-probs (``logprobs=0``);
- ``project``: `VLLMRollout.generate` without and with log-probs, and right after a
  ``sleep()`` + ``wake_up()`` (what every training step does).
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

BODY = {"0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
        "1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, intermediate_size=8960)}


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
    from verl_mp.trainer.setup import load_tokenizer

    dataset = PromptDataset(data, load_tokenizer(model), max_prompt_length=64)
    defaults = DataConfig()
    first = ResumableBatchSampler(len(dataset), num, seed=defaults.seed, shuffle=defaults.shuffle).next_batch()
    return dataset.get_batch(first).input_ids


TIMES: dict[str, list[dict]] = {}
"""Every timed call of every case (tokens, seconds): the spread between repeats is part of the result."""


def timed(fn, repeats: int, warmup=None, name: str = "") -> tuple[float, int]:
    """Median tokens/s over ``repeats`` calls after one warm-up call."""
    (warmup or fn)()  # warm-up (``warmup``: a smaller batch, when the full one takes minutes)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = fn()
        runs.append((time.perf_counter() - start, tokens))
    TIMES[name] = [{"tokens": t, "seconds": round(s, 3), "tokens_per_s": round(t / s, 1)} for s, t in runs]
    return statistics.median(t / s for s, t in runs), runs[0][1]


def standalone(a) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=a.model, dtype="bfloat16", max_model_len=a.max_new_tokens + 64, seed=0,
              gpu_memory_utilization=a.gpu_memory_utilization, logprobs_mode="processed_logprobs")
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts(a.prompts, a.data, a.model)]
    out = {}
    for name, logprobs in (("no_logprobs", None), ("logprobs", 0)):
        if name not in a.cases.split(","):
            continue
        params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_new_tokens, logprobs=logprobs, seed=None)

        def run(params=params, prompts=batch):
            outs = llm.generate(prompts, params, use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)

        out[name] = timed(run, a.repeats, warmup=lambda run=run: run(prompts=batch[:a.warmup_prompts]), name=name)[0]
    return out


def project(a) -> dict:
    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    init_distributed()
    cfg = RolloutConfig(dtype="bf16", max_model_len=a.max_new_tokens + 64, sleep_level=1,  # generates after a
                        gpu_memory_utilization=a.gpu_memory_utilization)  # sleep with no sync: the weights must stay
    rollout = VLLMRollout(cfg, a.model, num_kv_heads=2)
    batch = prompts(a.prompts, a.data, a.model)
    out = {}
    for name, logprobs in (("no_logprobs", False), ("logprobs", True)):
        sampling = SamplingConfig(n=a.n, max_new_tokens=a.max_new_tokens, logprobs=logprobs, seed=7)
        out[name] = timed(lambda s=sampling: rollout.generate(batch, s).num_tokens, a.repeats, name=name)[0]
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
    p.add_argument("--cases", default="no_logprobs,logprobs", help="standalone: which of no_logprobs,logprobs")
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
