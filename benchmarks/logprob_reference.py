"""Whose rounding is the rollout-vs-trainer gap? Both sides against an fp32 reference.

The training loop's ``rollout/logprob_diff_*`` compares vLLM's log-probs of its own samples with
the trainer's (Megatron) on the same tokens, both in bf16. That number alone cannot say which
side rounds more, nor compare two architectures fairly (DeepSeek-V3's gap against Qwen3-MoE's,
issue 43; verl_mp's gap against TRL's, issue 36). This benchmark samples with the project's
vLLM rollout (the sampler's log-probs, as the loop records them), scores the same tokens with
the Megatron engine, and with HF transformers in fp32 (the reference: each sample alone, no
padding) and in bf16 (an independent bf16 implementation), and reports every pair's |difference|
over the response tokens: max, 99th percentile and mean. If the engine is as far from fp32 as HF
bf16 is, the trainer rounds like a plain bf16 model and the rest of the gap is vLLM's kernels.

No routing replay anywhere (the loop's ``actor.router_replay=rollout`` makes the trainer follow
vLLM's experts; HF cannot): for a mixture of experts each side routes by its own scores, so a
near-tie that flips makes the max large; the mean and the percentile are the fairer figures.
``--eager`` runs vLLM as the loop does under replay with the hooks' capture (no CUDA graphs, no
compilation: `RolloutConfig.runs_eager`), whose fusions may round differently from the compiled engine.

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/logprob_reference.py \\
        --model DIR --out OUT.json [--dtype bf16] [--prompts 32] [--samples 4] [--max-new 128]

One process (the engine at TP 1, vLLM at TP 1); on a GPU vLLM sleeps while the others score.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

PAIRS = (("vllm", "engine"), ("vllm", "hf_fp32"), ("engine", "hf_fp32"), ("hf_bf16", "hf_fp32"),
         ("vllm", "hf_bf16"), ("engine", "hf_bf16"))
"""The pairs compared; ``vllm``-``engine`` is the loop's own gap."""


def per_sample(logprobs: torch.Tensor, responses: list[list[int]]) -> list[list[float]]:
    """Each response's log-probs from a ``[samples, response positions]`` tensor."""
    return [logprobs[i, : len(r)].float().tolist() for i, r in enumerate(responses)]


def differences(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """|a - b| over every response token: max, 99th percentile, mean, and the token count."""
    if not any(a):
        raise SystemExit("logprob_reference: every response is empty (raise --max-new, or the model stops at once)")
    d = torch.tensor([abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)],
                     dtype=torch.float64)
    return {"max": float(d.max()), "p99": float(torch.quantile(d, 0.99)), "mean": float(d.mean()),
            "tokens": int(d.numel())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="an HF checkpoint directory (random weights are fine)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="vLLM's and the engine's dtype")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eager", action="store_true",
                   help="vLLM without CUDA graphs or compilation, as the loop runs it with routing replay's hooks "
                   "(`RolloutConfig.runs_eager`): the vLLM side of a MoE run with actor.router_replay=rollout")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from verl_mp.cli.rank_verify import hf_log_probs
    from verl_mp.cli.rank_verify_rollout import engine_logprobs
    from verl_mp.data.rl_batch import attention_mask
    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.models.hf_checkpoint import open_hf_checkpoint
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    init_distributed()
    cuda = torch.cuda.is_available()
    spec = open_hf_checkpoint(a.model, config_only=True).spec
    g = torch.Generator().manual_seed(a.seed)
    prompts = [torch.randint(5, spec.vocab_size, (int(k),), generator=g).tolist()
               for k in torch.randint(8, 33, (a.prompts,), generator=g)]
    timings = {}

    started = time.perf_counter()
    rollout = VLLMRollout(RolloutConfig(dtype=a.dtype, max_model_len=64 + a.max_new, gpu_memory_utilization=0.3,
                                        sleep_level=1, enforce_eager=True if a.eager else None),
                          a.model, spec.num_query_groups, moe=spec.moe is not None)
    out = rollout.generate(prompts, SamplingConfig(n=a.samples, max_new_tokens=a.max_new, temperature=1.0,
                                                   logprobs=True, seed=a.seed))
    timings["vllm_s"] = time.perf_counter() - started
    samples = [prompts[i // a.samples] for i in range(len(out.response_ids))]
    responses = [list(r) for r in out.response_ids]
    keep = [i for i, r in enumerate(responses) if r]
    samples, responses = [samples[i] for i in keep], [responses[i] for i in keep]
    scores = {"vllm": [list(out.response_logprobs[i]) for i in keep]}
    if cuda:
        rollout.sleep()  # its weights to the CPU, its KV cache dropped: room for the others

    started = time.perf_counter()
    engine = MegatronEngine(EngineConfig(model_path=a.model, role="ref", dtype=a.dtype, micro_batch_size=4))
    engine.load_hf()
    batch, lp = engine_logprobs(engine, samples, responses)
    scores["engine"] = per_sample(lp, responses)
    del engine
    timings["engine_s"] = time.perf_counter() - started

    for name, dtype in (("hf_fp32", torch.float32), ("hf_bf16", torch.bfloat16)):  # HF on the same rows
        started = time.perf_counter()
        hf = hf_log_probs(a.model, batch.input_ids, attention_mask(batch), dtype, "cuda" if cuda else "cpu")
        scores[name] = per_sample(batch.gather_response(hf), responses)
        timings[f"{name}_s"] = time.perf_counter() - started
        if cuda:
            torch.cuda.empty_cache()

    result = {"model": os.path.basename(os.path.normpath(a.model)), "dtype": a.dtype, "samples": len(responses),
              "vllm_eager": a.eager,
              "moe": spec.moe is not None, "mla": getattr(spec, "mla", None) is not None,
              "pairs": {f"{x}-{y}": differences(scores[x], scores[y]) for x, y in PAIRS},
              "seconds": {k: round(v, 1) for k, v in timings.items()}}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("pair | max | p99 | mean")
    for pair, d in result["pairs"].items():
        print(f"{pair} | {d['max']:.4g} | {d['p99']:.4g} | {d['mean']:.4g}")
    print(json.dumps(result), flush=True)
    rollout.close()
    os._exit(0)  # vLLM's in-process engine has no clean shutdown


if __name__ == "__main__":
    main()
