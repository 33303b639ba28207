"""``rollout.backend=sglang`` on one GPU, for tests/gpu/test_rollout_sglang_gpu.py (1 torchrun rank).

``--mode parity``: Megatron (TP1) and SGLangRollout (TP1) from the same HF checkpoint; sample,
score with Megatron (gap before), SGLang sleeps (device memory asleep vs awake, read with
``torch.cuda.mem_get_info``: SGLang's memory lives in its scheduler process), one optimizer step,
wake the weights, the ``gather`` sync into SGLang, wake the rest, sample again (gap after) and
how far the step moved SGLang's log-probs. ``--mode speed``: the same prompts through a bare
``sglang.Engine`` and through SGLangRollout.generate (log-probs on in both), tokens/s each.
Writes JSON to ``--out``.
"""

import argparse
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def used_gib() -> float:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def prompts_for(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, vocab, (int(n),), generator=g).tolist() for n in torch.randint(3, 9, (count,), generator=g)]


def parity(a) -> dict:
    from verl_mp.bridge.weight_sync import make_weight_sync, push_weights
    from verl_mp.cli.rank_verify_rollout import engine_logprobs, gap
    from verl_mp.config.optim import OptimConfig
    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.data.rl_batch import attention_mask, to_positions
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.rollout.sglang_rollout import SGLangRollout

    engine = MegatronEngine(EngineConfig(model_path=a.model, micro_batch_size=4, dtype="bf16",
                                         optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    engine.load_hf()
    rollout = SGLangRollout(RolloutConfig(backend="sglang", max_model_len=128, dtype="bf16", gpu_memory_utilization=0.3,
                                          sleep_level=a.sleep_level, sglang_attention_backend=a.attention_backend),
                            a.model, engine.spec.num_query_groups, max_positions=engine.spec.max_position_embeddings)
    sync = make_weight_sync(engine.spec, engine.chunks, engine.state, 64, "auto", rollout)
    prompts = prompts_for(engine.spec.vocab_size, 8)
    sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=10)
    out0 = rollout.generate(prompts, sampling)
    batch0, eng0 = engine_logprobs(engine, prompts, out0.response_ids)
    before = gap(batch0, eng0, out0.response_logprobs)
    r = {"sync_mode": sync.mode, "before_gap": before["max"], "awake_gib": used_gib()}
    t = time.perf_counter()
    rollout.sleep()
    r["sleep_s"], r["asleep_gib"] = time.perf_counter() - t, used_gib()
    mask = to_positions(batch0, batch0.response_mask)
    total = float(mask.sum())
    inputs = {"input_ids": batch0.input_ids, "attention_mask": attention_mask(batch0), "response_mask": mask}
    engine.train_step(inputs, lambda out, mb: (-(out["log_probs"] * mb["response_mask"]).sum() / total, {}))
    t = time.perf_counter()
    rollout.wake_up(["weights"])
    r["wake_weights_s"] = time.perf_counter() - t
    t = time.perf_counter()
    push_weights(sync, rollout)
    r["sync_s"], r["sync_bytes"] = time.perf_counter() - t, sync.last_stats.bytes_synced
    t = time.perf_counter()
    rollout.wake_up()
    r["wake_rest_s"], r["rewoken_gib"] = time.perf_counter() - t, used_gib()
    out1 = rollout.generate(prompts, sampling)
    batch1, eng1 = engine_logprobs(engine, prompts, out1.response_ids)
    after = gap(batch1, eng1, out1.response_logprobs)
    r.update(after_gap=after["max"], mean_gap_after=after["mean"])
    # the step moved the model by more than the gap (Megatron's log-probs of the first samples, old vs new):
    # an after-gap within tolerance then means the update reached SGLang
    _, eng0_new = engine_logprobs(engine, prompts, out0.response_ids)
    r["changed"] = float((eng0_new - eng0).abs().max())
    rollout.close()
    return r


def speed(a) -> dict:
    import sglang

    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.rollout.sglang_rollout import SGLangRollout, engine_kwargs, engine_start_env, request_batch

    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(a.model)
    vocab = hf.vocab_size
    prompts = prompts_for(vocab, a.prompts, seed=1)
    sampling = SamplingConfig(n=a.n, temperature=1.0, max_new_tokens=a.max_new_tokens, ignore_eos=True)
    cfg = RolloutConfig(backend="sglang", max_model_len=a.max_new_tokens + 16, dtype="bf16",
                        gpu_memory_utilization=0.5, sglang_attention_backend=a.attention_backend)
    r = {}
    with engine_start_env():  # as SGLangRollout starts its engine (under torchrun)
        bare = sglang.Engine(**engine_kwargs(cfg, a.model, torch.cuda.current_device(), hf.max_position_embeddings))
    ids, params = request_batch(prompts, list(range(len(prompts))), sampling)
    bare.generate(input_ids=ids[:8], sampling_params=params[:8], return_logprob=True)  # warm-up
    t = time.perf_counter()
    outs = bare.generate(input_ids=ids, sampling_params=params, return_logprob=True)
    r["alone_s"] = time.perf_counter() - t
    r["alone_tokens"] = sum(len(o["output_ids"]) for o in outs)
    bare.shutdown()
    rollout = SGLangRollout(cfg, a.model, hf.num_key_value_heads, max_positions=hf.max_position_embeddings)
    rollout.generate(prompts[:8], sampling)  # warm-up
    t = time.perf_counter()
    out = rollout.generate(prompts, sampling)
    r["rollout_s"] = time.perf_counter() - t
    r["rollout_tokens"] = out.num_tokens
    rollout.close()
    r["alone_tokens_per_s"] = r["alone_tokens"] / r["alone_s"]
    r["rollout_tokens_per_s"] = r["rollout_tokens"] / r["rollout_s"]
    r["ratio"] = r["rollout_tokens_per_s"] / r["alone_tokens_per_s"]
    return r


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=("parity", "speed"), required=True)
    p.add_argument("--sleep-level", type=int, default=2, choices=(1, 2))
    p.add_argument("--attention-backend", default="triton")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", required=True)
    p.add_argument("--hang-s", type=float, default=360.0,
                   help="print every thread's stack and exit after this many seconds (a hung engine start "
                        "then costs minutes of device time, not the whole call)")
    a = p.parse_args()
    faulthandler.dump_traceback_later(a.hang_s, exit=True, file=sys.stderr)
    if not dist.is_initialized():
        dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    r = parity(a) if a.mode == "parity" else speed(a)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(r, f)
    dist.barrier()
    os._exit(0)  # SGLang's engine threads and Megatron's state: no clean teardown needed


if __name__ == "__main__":
    main()
