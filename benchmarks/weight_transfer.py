"""Benchmark (and check) the weight channel between an actor's rank 0 and a rollout's ranks.

`verl_mp.bridge.transport`: the sender packs HF-named tensors into buckets and broadcasts
them over a process group of its own (gloo on CPU, NCCL on GPUs); receivers get a fresh
buffer per bucket and hand out views, as vLLM's in-place reload consumes them. Run under
torchrun with 1 + R ranks (rank 0 sends, ranks 1..R receive):

    # CPU (gloo), 1 GB of bf16 in 256 MB buckets to one receiver
    torchrun --standalone --nproc-per-node 2 benchmarks/weight_transfer.py --gb 1 --out cpu.json
    # GPUs (NCCL), one GPU per rank; 2 GPUs: the actor's GPU -> one rollout GPU
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 benchmarks/weight_transfer.py --gb 14 --out gpu.json

The synthetic model is Qwen2-7B-shaped layers (hidden 3584, FFN 18944, 4 KV heads) up to
``--gb``, after the embedding when that is under a quarter of it. Every iteration is timed on every rank (median over
``--iters`` after one warm-up); ``--check`` regenerates every tensor on the receivers and
compares it bit for bit after the whole transfer (receivers keep every view, as vLLM may
until a layer is complete). The torchrun world only hands out the channel's port.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def model_shapes(gb: float, dtype: torch.dtype, hidden: int = 3584, ffn: int = 18944, kv: int = 512,
                 vocab: int = 152064) -> dict[str, tuple[int, ...]]:
    """HF-style names -> shapes of whole layers until ``gb`` GB; the embedding first when it
    is under a quarter of that (a 7B model's is 1.09 GB in bf16)."""
    embed = {"model.embed_tokens.weight": (vocab, hidden)}
    shapes: dict[str, tuple[int, ...]] = embed if vocab * hidden * dtype.itemsize < gb * 1e9 / 4 else {}
    layer = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.q_proj.bias": (hidden,),
             "self_attn.k_proj.weight": (kv, hidden), "self_attn.v_proj.weight": (kv, hidden),
             "self_attn.o_proj.weight": (hidden, hidden), "mlp.gate_proj.weight": (ffn, hidden),
             "mlp.up_proj.weight": (ffn, hidden), "mlp.down_proj.weight": (hidden, ffn),
             "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
             "mlp.gate.e_score_correction_bias": (64,)}  # DeepSeek-V3's routing bias: sent in fp32

    def nbytes(s):
        return sum(_numel(x) for x in s.values()) * dtype.itemsize

    i = 0
    while nbytes(shapes) < gb * 1e9:
        shapes.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
        i += 1
    return shapes


def make_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor determined by its name (the receivers rebuild it to check the transfer); the
    tensors the channel keeps in fp32 (`FP32_HF_TENSORS`) in fp32."""
    from verl_mp.models.registry import FP32_HF_TENSORS

    dtype = torch.float32 if name.endswith(FP32_HF_TENSORS) else dtype
    g = torch.Generator(device="cpu").manual_seed(sum(map(ord, name)) * 7919 + len(name))
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def run(args) -> dict | None:
    from verl_mp.bridge.transport import Manifest, TransferStats, WeightChannel, receive, send
    from verl_mp.engine.runtime import init_distributed
    from verl_mp.utils.net import reserve_port

    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    holder = [reserve_port("127.0.0.1") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    dtype = DTYPES[args.dtype]
    shapes = model_shapes(args.gb, dtype, **({"hidden": 96, "ffn": 200, "kv": 32, "vocab": 3001} if args.small else {}))
    channel = WeightChannel.open("127.0.0.1", holder[0], rank, world, name="bench")
    channel.agree(Manifest.plan(shapes, dtype, int(args.bucket_mb * 2**20)) if rank == 0 else None)
    # The sender's tensors live on its device already (as the actor's gathered shards do).
    source = {n: make_tensor(n, s, dtype, channel.device) for n, s in shapes.items()} if rank == 0 else None
    times, waits, ok, fp32_received = [], [], True, 0
    for it in range(args.iters + 1):
        stats = TransferStats()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        channel.barrier()
        start = time.perf_counter()
        if rank == 0:
            send(channel, iter(source.items()), stats)
        else:
            kept = list(receive(channel, stats))  # every view kept until the end
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if it > 0:
            times.append(elapsed)
            waits.append(stats.wait_seconds)
        if args.check and rank != 0 and it == args.iters:
            want = {n: make_tensor(n, shapes[n], dtype, channel.device) for n in shapes}
            ok = all(n == name and t.dtype == want[n].dtype and torch.equal(t, want[n])
                     for (name, t), n in zip(kept, shapes, strict=True))
            fp32_received = sum(t.dtype == torch.float32 for _, t in kept)
    result = {"rank": rank, "role": "sender" if rank == 0 else "receiver", "ok": ok, "fp32_received": fp32_received,
              "seconds_median": statistics.median(times), "seconds": times,
              "wait_seconds_median": statistics.median(waits)}
    everything = [None] * world
    dist.all_gather_object(everything, result)
    if rank != 0:
        return None
    gb = channel.layout.total_bytes / 1e9
    slowest = max(r["seconds_median"] for r in everything)
    return {"backend": "nccl" if torch.cuda.is_available() else "gloo", "receivers": world - 1,
            "dtype": args.dtype, "gb": gb, "bucket_mb": args.bucket_mb, "buckets": len(channel.layout.buckets),
            "tensors": len(shapes), "seconds_median": slowest, "s_per_gb": slowest / gb, "gb_per_s": gb / slowest,
            "ok": all(r["ok"] for r in everything), "ranks": everything,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=1.0, help="model size to move")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--bucket-mb", type=float, default=256.0)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--check", action="store_true", help="receivers compare every tensor bit for bit")
    p.add_argument("--small", action="store_true", help="tiny odd layer shapes (tests)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args)
    if result is not None:
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with open(args.out, "w") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
