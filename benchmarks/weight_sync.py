"""Benchmark the whole Megatron -> vLLM weight sync (gather/reshard, convert, vLLM load).

Run under torchrun on GPUs (world size = train TP = rollout TP):

    torchrun --nproc-per-node 1 benchmarks/weight_sync.py --size 1.5b --out result.json

Builds a randomly initialised megatron GPTModel of a real shape (bf16) and a colocated
vLLM engine started with ``load_format=dummy``; then times ``iters`` full syncs
in each mode (``gather``: bucketed TP gather -> HF names -> ``reload_weights``;
``local``: this rank's shards -> vLLM's parameters in place, in one multi-tensor copy with one
pipeline stage; ``local_buckets``: the same through buckets) and reports seconds, seconds per
GB of model, GB moved per rank and the sync's transient memory. A final check compares one vLLM and one Megatron
tensor after the sync. ``--sleep level1,level2,keep`` puts vLLM to sleep before each sync
as the training loop does, and the seconds then include waking its weights (the loop's
weight-sync phase; benchmark vs loop is issue 14's ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

SHAPES = {
    # Qwen2-1.5B and Qwen2-7B shapes
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}


def write_config(size: str, directory: str) -> str:
    from transformers import Qwen2Config

    from verl_mp.demo.tokenizer import build_tiny_tokenizer

    cfg = Qwen2Config(**SHAPES[size], max_position_embeddings=4096, rms_norm_eps=1e-6, torch_dtype="bfloat16",
                      architectures=["Qwen2ForCausalLM"])
    cfg.save_pretrained(directory)
    build_tiny_tokenizer().save_pretrained(directory)
    return directory


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", choices=sorted(SHAPES), default="1.5b")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--modes", default="gather,local",
                   help="comma separated: gather, local (as the trainer syncs: in place where it can), "
                        "local_buckets (local mode streamed through buckets)")
    p.add_argument("--sleep", default="awake",
                   help="comma separated: awake (vLLM never sleeps: the copy alone), level1, level2 "
                        "(rollout.sleep_level), keep (rollout.keep_weights_on_gpu); each but awake puts vLLM "
                        "to sleep before every sync and times its wake-up too, as the training loop does")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from transformers import AutoConfig

    from verl_mp.config.parallel import ParallelConfig
    from verl_mp.config.rollout import RolloutConfig
    from verl_mp.engine import model as mmodel
    from verl_mp.engine.runtime import initialize_parallel
    from verl_mp.models.hf_config import spec_from_hf_config
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    parallel = ParallelConfig(tensor_model_parallel_size=world)
    state = initialize_parallel(parallel)
    path = os.path.join(tempfile.gettempdir(), f"verl_mp_bench_{a.size}")
    if dist.get_rank() == 0:
        write_config(a.size, path)
    dist.barrier()
    spec = spec_from_hf_config(AutoConfig.from_pretrained(path))
    chunks = mmodel.build_gpt_chunks(spec, mmodel.transformer_config(spec, parallel, "bf16"), state)
    train_bytes = torch.cuda.memory_allocated()
    rollout = VLLMRollout(RolloutConfig(tensor_model_parallel_size=world, dtype="bf16", load_format="dummy",
                                        gpu_memory_utilization=0.35, enforce_eager=True, max_model_len=2048),
                          path, spec.num_query_groups)
    results = [_time_mode(mode, sleep, spec, chunks, state, rollout, a, world, train_bytes)
               for mode in a.modes.split(",") for sleep in a.sleep.split(",")]
    if dist.get_rank() == 0:
        for result in results:
            print(json.dumps(result))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(results, f, indent=1)
    dist.barrier()
    rollout.close()
    os._exit(0)


SLEEPS = {"awake": None, "level1": dict(sleep_level=1, keep_weights_on_gpu=False),
          "level2": dict(sleep_level=2, keep_weights_on_gpu=False), "keep": dict(keep_weights_on_gpu=True)}
"""Each sets every sleep setting, so that none is left over from the case timed before it."""


def _time_mode(mode, sleep, spec, chunks, state, rollout, a, world, train_bytes) -> dict:
    """Warm up, then time ``a.iters`` whole syncs in one mode (``gather`` or ``local``); with a
    ``sleep`` other than ``awake`` each sync follows a sleep, and the seconds include waking
    the weights (the loop's weight-sync phase); the KV cache's wake-up is timed on its own."""
    from dataclasses import replace

    from verl_mp.bridge.weight_sync import make_weight_sync, push_weights

    sync = make_weight_sync(spec, chunks, state, a.bucket_mb, "local" if mode.startswith("local") else mode, rollout)

    def load():  # as the trainer does (in place where it can), or the bucketed stream
        if mode == "local_buckets":
            rollout.load_weights(sync.iter_weights(), kernel_format=sync.kernel_format)
        else:
            push_weights(sync, rollout)

    load()  # warm-up (and the direct copy's plan)
    if SLEEPS[sleep] is not None:
        rollout.cfg = replace(rollout.cfg, **SLEEPS[sleep])
    times, peaks, parts = [], [], {"sleep_s": [], "wake_weights_s": [], "wake_kv_cache_s": []}
    for _ in range(a.iters):
        torch.cuda.synchronize()
        if SLEEPS[sleep] is not None:
            t = time.perf_counter()
            rollout.sleep()
            parts["sleep_s"].append(time.perf_counter() - t)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        rollout.wake_up(["weights"])  # nothing to do when awake or with the weights kept
        torch.cuda.synchronize()
        parts["wake_weights_s"].append(time.perf_counter() - t0)
        load()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peaks.append(torch.cuda.max_memory_allocated() - base)
        t = time.perf_counter()
        rollout.wake_up()  # the KV cache, as generation does
        torch.cuda.synchronize()
        parts["wake_kv_cache_s"].append(time.perf_counter() - t)
    stats = sync.last_stats
    median = sorted(times)[len(times) // 2]
    part_medians = {k: sorted(v)[len(v) // 2] for k, v in parts.items() if v}
    model_gb = sum(i.param.numel() * i.param.element_size() * (state.tp_size if i.tp_dim is not None else 1)
                   for i in sync.infos) / 1e9
    check = {}
    if sync.kernel_format:  # the in-place shards must equal what vLLM's own loader builds
        from verl_mp.cli.rank_verify_rollout import local_vs_loader

        check["local_vs_loader_max_abs_diff"] = local_vs_loader(spec, chunks, state, rollout, a.bucket_mb)
    return dict(**check, size=a.size, world=world, mode=mode, direct_copy=mode == "local" and sync.copies_directly,
                sleep=sleep, **part_medians, dtype="bf16",
                bucket_mb=a.bucket_mb,
                model_gb=model_gb, moved_gb_per_rank=stats.bytes_synced / 1e9,
                tp_gathered_gb_per_rank=stats.tp_gathered_bytes / 1e9, seconds_median=median,
                seconds_all=times, seconds_per_model_gb=median / model_gb,
                sync_transient_peak_gb=stats.peak_transient_bytes / 1e9,
                cuda_peak_extra_gb=max(peaks) / 1e9, train_weights_gb=train_bytes / 1e9,
                num_buckets=stats.num_buckets, final_layernorm_max_abs_diff=_check_one_tensor(rollout, chunks),
                gpu=torch.cuda.get_device_name(), torch=torch.__version__)


def _check_one_tensor(rollout, chunks) -> float:
    """Max |vLLM final norm - Megatron final norm| (a replicated tensor: exact after sync)."""
    from verl_mp.engine.layout import unwrap

    megatron = unwrap(chunks[-1]).decoder.final_layernorm.weight.detach().float()

    def read(worker):
        model = worker.model_runner.get_model()
        return model.model.norm.weight.detach().float().cpu()

    vllm = rollout.llm.collective_rpc(read)[0]
    return float((vllm - megatron.cpu()).abs().max())


if __name__ == "__main__":
    main()
