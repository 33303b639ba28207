"""Training throughput of the engine on one GPU: tokens/s, TFLOP/s, MFU, peak memory.

The Qwen2-1.5B shape (hidden 1536, 28 layers, 12/2 heads, FFN 8960, vocabulary 151936,
tied embeddings), random bf16 weights, 16 rows x 4096 tokens, the actor's real loss
(`verl_mp.workers.losses.actor_loss`: PPO clip + entropy) through `MegatronEngine.train_step`
with the fused log-prob kernel. For each variant (micro-batch, activation recompute): one
warm-up step, then the median of ``--repeats`` steps.

FLOPs per step = 6 x matmul parameters (LM head included) x tokens + causal attention
(6 x layers x seq^2 x heads x head_dim per sequence). MFU is given against the datasheet's
989 TFLOP/s and against this card's bf16 matmul rate, measured here first (8192^3
``torch.mm`` on random data, median of 20).

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/train_mfu.py --out OUT.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SHAPE = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
             intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
             rms_norm_eps=1e-6, rope_theta=1e6)
PEAK_TFLOPS = 989.0
VARIANTS = [(2, "none"), (4, "none"), (8, "none"), (8, "selective"), (16, "selective"), (8, "full")]


def matmul_tflops(n: int = 8192, repeats: int = 20) -> float:
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    times = []
    for _ in range(repeats + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times[3:]) / 1e12


def model_dir(root: Path) -> str:
    from transformers import Qwen2Config

    cfg = Qwen2Config(**SHAPE, architectures=["Qwen2ForCausalLM"], torch_dtype="bfloat16")
    cfg.save_pretrained(root)
    return str(root)


def flops_per_step(rows: int, seq: int) -> float:
    s = SHAPE
    h, heads, kv, ffn, layers = (s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"],
                                 s["intermediate_size"], s["num_hidden_layers"])
    d = h // heads
    per_layer = h * d * (heads + 2 * kv) + heads * d * h + 3 * h * ffn
    matmul_params = layers * per_layer + s["vocab_size"] * h
    attention = 6 * layers * seq * seq * heads * d * rows
    return 6 * matmul_params * rows * seq + attention


def batch(rows: int, seq: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SHAPE["vocab_size"], (rows, seq), generator=g)
    mask = torch.ones(rows, seq, dtype=torch.long)
    response = torch.ones(rows, seq)
    response[:, -1] = 0
    return {"input_ids": ids, "attention_mask": mask, "response_mask": response,
            "old_log_probs": -torch.rand(rows, seq, generator=g) * response,
            "advantages": torch.randn(rows, seq, generator=g) * response}


def live_at_peak(snapshot: dict, top: int = 12) -> dict:
    """Replay a CUDA allocator trace: the GiB live at the step's peak, grouped by allocation site
    (the two innermost frames in verl_mp/ or megatron/, else the innermost Python frame)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            frames = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}" for f in event["frames"]
                      if f["filename"].endswith(".py")]
            ours = [f for f in frames if "verl_mp/" in f or "megatron/" in f]
            site = " < ".join(ours[:2]) or (frames[0] if frames else "?")
            live[event["addr"]] = (event["size"], site)
            total += event["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])[0]
    by_site: dict[str, int] = {}
    for size, site in at_peak.values():
        by_site[site] = by_site.get(site, 0) + size
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1])[:top]
    return {"traced_peak_gib": peak / 2**30, "sites_gib": {k: round(v / 2**30, 2) for k, v in ranked}}


def run_variant(path: str, micro: int, recompute: str, data: dict, repeats: int, profile: str | None = None,
                entropy: bool = True, memory: bool = False) -> dict:
    from verl_mp.config.optim import OptimConfig
    from verl_mp.config.schema import ActorConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.workers.losses import actor_loss

    before = torch.cuda.memory_allocated() / 2**30  # 0 unless an earlier variant's engine is still alive
    cfg = EngineConfig(model_path=path, role="actor", dtype="bf16", micro_batch_size=micro, recompute=recompute,
                       attention_backend="sdpa", optim=OptimConfig(lr=1e-6), total_training_steps=100)
    engine = MegatronEngine(cfg)
    tokens = float(data["response_mask"].sum())
    loss = actor_loss(ActorConfig(entropy_coeff=0.001 if entropy else 0.0), tokens, float(len(data["input_ids"])), data["input_ids"].shape[1])
    times = []
    torch.cuda.reset_peak_memory_stats()
    try:
        for _ in range(repeats + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            engine.train_step(data, loss, with_entropy=entropy)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        if profile:  # one more step under torch.profiler: kernels by kind (verl_mp.utils.profiling)
            from verl_mp.config.profile import ProfileConfig
            from verl_mp.utils.profiling import StepProfiler, phase

            prof = StepProfiler()
            name = f"micro{micro}_{recompute}" + ("" if entropy else "_noent")
            prof.start(profile, name, ProfileConfig(trace=False))  # the table, not the timeline
            with phase("train_step"):
                engine.train_step(data, loss, with_entropy=entropy)
            print(json.dumps({"profile": name, **prof.stop()}), flush=True)
        if memory:  # one more step recording every allocation: what is live at the peak
            torch.cuda.memory._record_memory_history(max_entries=500_000)
            engine.train_step(data, loss, with_entropy=entropy)
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            print(json.dumps({"memory_at_peak": f"micro{micro}_{recompute}_entropy={entropy}", **live_at_peak(snapshot)}),
                  flush=True)
    except torch.OutOfMemoryError:
        return {"micro_batch": micro, "recompute": recompute, "entropy": entropy, "oom": True,
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    finally:
        del engine
        gc.collect()  # the engine's reference cycles: without this its memory counts in the next variant's peak
        torch.cuda.empty_cache()
    step = statistics.median(times[1:])
    return {"micro_batch": micro, "recompute": recompute, "entropy": entropy, "step_s": step,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "allocated_before_gib": before}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(f"{m}:{r}" for m, r in VARIANTS),
                   help="micro:recompute[:noent] ...; noent: the loss without the entropy bonus")
    p.add_argument("--profile", default=None, help="a directory: profile one more step of each variant there")
    p.add_argument("--memory", action="store_true", help="one more step: the allocations live at its peak, by site")
    a = p.parse_args()
    from verl_mp.engine.runtime import init_distributed

    init_distributed()
    measured = matmul_tflops()
    flops = flops_per_step(a.rows, a.seq)
    data = batch(a.rows, a.seq)
    results = {"matmul_tflops": measured, "rows": a.rows, "seq": a.seq, "flops_per_step": flops, "variants": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(Path(tmp))
        for spec in a.variants.split(","):
            micro, recompute, *rest = spec.split(":")
            r = run_variant(path, int(micro), recompute, data, a.repeats, a.profile, entropy=rest != ["noent"],
                            memory=a.memory)
            if not r.get("oom"):
                tflops = flops / r["step_s"] / 1e12
                r.update(tokens_per_s=a.rows * a.seq / r["step_s"], tflops=tflops,
                         mfu_peak=tflops / PEAK_TFLOPS, mfu_measured=tflops / measured)
            results["variants"].append(r)
            Path(a.out).write_text(json.dumps(results, indent=1))
            print(json.dumps(r), flush=True)
    print(f"matmul rate measured: {measured:.0f} TFLOP/s (bf16 8192^3)")
    print("micro  recompute   entropy  step_s  tokens/s  TFLOP/s  MFU(989)  MFU(measured)  peak GiB")
    for r in results["variants"]:
        if r.get("oom"):
            print(f"{r['micro_batch']:>5}  {r['recompute']:<10}  {r['entropy']!s:<7}  out of memory (peak {r['peak_gib']:.1f} GiB)")
            continue
        print(f"{r['micro_batch']:>5}  {r['recompute']:<10}  {r['entropy']!s:<7}  {r['step_s']:6.3f}  {r['tokens_per_s']:8.0f}  "
              f"{r['tflops']:7.1f}  {r['mfu_peak']:8.1%}  {r['mfu_measured']:13.1%}  {r['peak_gib']:8.1f}")


if __name__ == "__main__":
    main()
