"""Check the Megatron actor -> vLLM rollout path at one (train TP, PP, EP, expert-TP, rollout TP).

Run on ``max(training ranks, rollout_tp)`` ranks (``verl-mp verify --rollout vllm --rollout-tp K``
does that): loads the HF checkpoint into the engine and vLLM, samples, takes one optimizer
step on the sampled tokens, syncs the weights (with sleep/wake on GPU), samples again and
writes JSON with the vLLM-vs-Megatron log-prob gaps before and after, how far the step
moved vLLM's log-probs of the first samples, and the sync's memory high-water mark.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from verl_mp.config.rollout import WEIGHT_SYNC_MODES


def engine_logprobs(engine, prompts, responses):
    from verl_mp.data.rl_batch import RLBatch, attention_mask

    batch = RLBatch.from_samples(prompts, responses, 1, 0, [""] * len(prompts), [""] * len(prompts))
    lp = engine.compute_log_probs(batch.input_ids, attention_mask(batch))
    return batch, batch.gather_response(lp)


def gap(batch, engine_lp, rollout_lps) -> dict[str, float]:
    """|vLLM - engine| log-probs over the response tokens: the trainer's own metric
    (`verl_mp.trainer.steps.logprob_gap_metrics`), as ``{"max": ..., "mean": ...}``."""
    from dataclasses import replace

    from verl_mp.rollout.types import RolloutOutput
    from verl_mp.trainer.steps import logprob_gap_metrics

    padded = RolloutOutput(prompt_ids=[[0]] * len(rollout_lps), response_ids=[[0] * len(x) for x in rollout_lps],
                           response_logprobs=rollout_lps, n=1,
                           finished=[True] * len(rollout_lps)).padded_logprobs(engine_lp.shape[1])
    m = logprob_gap_metrics(replace(batch, rollout_log_probs=padded, old_log_probs=engine_lp.cpu()))
    return {"max": m["rollout/logprob_diff_max"], "mean": m["rollout/logprob_diff_mean"]}


def local_vs_loader(spec, chunks, state, rollout, bucket_mb: int) -> float:
    """Max |param| difference between the ``local`` sync's vLLM parameters and those vLLM's
    checkpoint loader builds from the ``gather`` sync's full HF tensors (expected: 0)."""
    from verl_mp.bridge.weight_sync import WeightSync

    def snapshot(worker):
        return {n: p.detach().clone() for n, p in worker.model_runner.get_model().named_parameters()}

    local = rollout.llm.collective_rpc(snapshot)[0]
    rollout.load_weights(WeightSync(spec, chunks, state, bucket_mb, "gather").iter_weights())
    loaded = rollout.llm.collective_rpc(snapshot)[0]
    diff = max(float((local[n].float() - loaded[n].float()).abs().max()) for n in loaded)
    t = torch.tensor([diff], device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def sync_vs_loader(engine, rollout, directory: str) -> dict:
    """After a sync: every parameter this rank's vLLM holds against what vLLM's own checkpoint
    loader (``reload_weights`` from files, then its post-load processing) builds from the
    engine's HF export written to ``directory``. Leaves the loaded weights (the same ones) in vLLM."""
    from pathlib import Path

    from safetensors import safe_open

    def snapshot(worker):
        return {n: p.detach().clone() for n, p in worker.model_runner.get_model().named_parameters()}

    synced = rollout.llm.collective_rpc(snapshot)[0]
    engine.export_hf(directory)
    dist.barrier()

    def from_files():
        for file in sorted(Path(directory).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

    rollout.load_weights(from_files())
    loaded = rollout.llm.collective_rpc(snapshot)[0]
    unequal = [n for n in loaded if n not in synced or synced[n].shape != loaded[n].shape
               or not torch.equal(synced[n], loaded[n])]
    diff = max((float((synced[n].float() - loaded[n].float()).abs().max()) for n in loaded
                if n in synced and synced[n].shape == loaded[n].shape and loaded[n].numel()), default=0.0)
    t = torch.tensor([diff, float(len(unequal)), float(set(synced) != set(loaded)), float(len(loaded))],
                     device="cuda" if torch.cuda.is_available() else "cpu")  # NCCL reduces CUDA tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"loader_max_abs_diff": float(t[0]), "loader_unequal_params": int(t[1]),
            "loader_names_differ": bool(t[2]), "loader_params_compared": int(t[3]),
            "loader_unequal_examples": unequal[:3]}


def _used_gb() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--rollout-tp", type=int, default=1)
    p.add_argument("--rollout-ep", action="store_true", help="vLLM expert parallelism (rollout.expert_parallel)")
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--sleep-level", type=int, default=1, choices=(1, 2),
                   help="rollout.sleep_level while the engine trains (2: vLLM drops its weights; the sync rewrites them)")
    p.add_argument("--keep-weights", action="store_true",
                   help="rollout.keep_weights_on_gpu: only the KV cache is released while the engine trains")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--sync-mode", default="auto", choices=WEIGHT_SYNC_MODES,
                   help="rollout.weight_sync_mode (local: rank-local shards, needs rollout TP == TP)")
    p.add_argument("--loader-check", default=None, metavar="DIR",
                   help="after the sync, export the engine's HF checkpoint to DIR and compare every vLLM parameter "
                        "with what vLLM's own loader builds from it (bit for bit)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    # lazy (here and in the helpers above): megatron and vLLM take seconds; the arguments come first
    from verl_mp.bridge.weight_sync import make_weight_sync, push_weights
    from verl_mp.config.optim import OptimConfig
    from verl_mp.config.parallel import ParallelConfig
    from verl_mp.config.rollout import RolloutConfig, SamplingConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.models.hf_checkpoint import open_hf_checkpoint
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    moe = open_hf_checkpoint(a.model, config_only=True).spec.moe is not None
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                              expert_model_parallel_size=a.ep, expert_tensor_parallel_size=a.etp,
                              sequence_parallel=moe and a.tp > 1)  # megatron trains MoE at TP > 1 only with SP
    engine = MegatronEngine(EngineConfig(model_path=a.model, parallel=parallel, micro_batch_size=4,
                                         dtype=a.dtype, optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    engine.load_hf()
    rollout = VLLMRollout(RolloutConfig(tensor_model_parallel_size=a.rollout_tp, max_model_len=128,
                                        dtype=a.dtype, gpu_memory_utilization=0.3, expert_parallel=a.rollout_ep,
                                        sleep_level=a.sleep_level, keep_weights_on_gpu=a.keep_weights),
                          a.model, engine.spec.num_query_groups, moe=moe)
    sync = make_weight_sync(engine.spec, engine.chunks, engine.state, a.bucket_mb, a.sync_mode, rollout)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, engine.spec.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 9, (8,), generator=g)]
    sampling = SamplingConfig(n=1, temperature=1.0, max_new_tokens=10, seed=7)

    out0 = rollout.generate(prompts, sampling)
    batch0, eng0 = engine_logprobs(engine, prompts, out0.response_ids)
    before_gap = gap(batch0, eng0, out0.response_logprobs)["max"]

    # one optimizer step: push up the log-prob of the sampled responses
    from verl_mp.data.rl_batch import attention_mask, to_positions

    mask_s = to_positions(batch0, batch0.response_mask)
    inputs = {"input_ids": batch0.input_ids, "attention_mask": attention_mask(batch0), "response_mask": mask_s}
    total = float(mask_s.sum())
    memory = {}
    if torch.cuda.is_available():  # hand device memory over: vLLM sleeps while Megatron trains
        torch.cuda.synchronize()
        memory["before_sleep_gb"] = _used_gb()
        rollout.sleep()
        memory["asleep_gb"] = _used_gb()
    engine.train_step(inputs, lambda out, mb: (-(out["log_probs"] * mb["response_mask"]).sum() / total, {}))
    if torch.cuda.is_available() and a.keep_weights:  # the weights vLLM kept score the first samples as before
        rollout.wake_up(["kv_cache"])
        kept = rollout.score(prompts, out0.response_ids)
        memory["kept_weights_gap"] = max(abs(x - y) for old, new in zip(out0.response_logprobs, kept, strict=True)
                                         for x, y in zip(old, new, strict=True))
        rollout.sleep()  # and again: the sync below wakes as the loop does (nothing, with kept weights)
    rollout.wake_up(["weights"])
    push_weights(sync, rollout)  # as the trainer does: in place where it can (local mode, one stage)
    cross = {"direct_copy": sync.copies_directly and torch.cuda.is_available()}
    if sync.kernel_format:  # vLLM's own loader, fed full HF tensors, must give the same parameters
        cross["local_vs_loader_max_abs_diff"] = local_vs_loader(engine.spec, engine.chunks, engine.state,
                                                                   rollout, a.bucket_mb)
    if a.loader_check:
        cross.update(sync_vs_loader(engine, rollout, a.loader_check))
    rollout.wake_up(["kv_cache"])
    if torch.cuda.is_available():
        memory["awake_gb"] = _used_gb()

    out1 = rollout.generate(prompts, sampling)
    batch1, eng1 = engine_logprobs(engine, prompts, out1.response_ids)
    after = gap(batch1, eng1, out1.response_logprobs)
    # the update arrived: old samples now score differently in vLLM, and as Megatron says
    rescored = rollout.score(prompts, out0.response_ids)
    _, eng0_new = engine_logprobs(engine, prompts, out0.response_ids)
    changed = gap(batch0, eng0, rescored)["max"]
    rescore_gap = gap(batch0, eng0_new, rescored)["max"]
    stats = sync.last_stats
    # a sync drops the prefixes cached since the last one (stale keys and values), and only those
    resets = []
    for _ in range(2):  # the engine ran since the last sync; then nothing did
        before = rollout.prefix_cache_resets
        push_weights(sync, rollout)
        resets.append(rollout.prefix_cache_resets - before)
    cross["prefix_cache_resets_per_sync"] = resets
    if dist.get_rank() == 0:
        state = engine.state
        largest = max(info.param.numel() * info.param.element_size()
                      * ((state.etp_size if info.expert else a.tp) if info.tp_dim is not None else 1)
                      for info in sync.infos)
        with open(a.out, "w") as f:
            json.dump({"before_gap": before_gap, "after_gap": after["max"], "rescore_gap": rescore_gap,
                       "changed": changed, "peak_transient_bytes": stats.peak_transient_bytes,
                       "bucket_bytes": sync.bucket_bytes, "largest_local_full_bytes": largest,
                       "largest_tensor_bytes_seen": stats.largest_tensor_bytes,
                       "bytes_synced": stats.bytes_synced, "num_buckets": stats.num_buckets,
                       "mean_gap_after": after["mean"],
                       "sync_mode": sync.mode, "tp_gathered_bytes": stats.tp_gathered_bytes,
                       "ep_broadcast_bytes": stats.ep_broadcast_bytes,
                       "sync_seconds": stats.seconds, **memory, **cross}, f)
    dist.barrier()
    rollout.close()
    os._exit(0)  # vLLM's in-process engine has no clean shutdown under torchrun


if __name__ == "__main__":
    main()
