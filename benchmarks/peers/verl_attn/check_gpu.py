"""On the GPU, before verl runs with `VERL_ATTN=varlen`: the varlen kernel path of peer_varlen.py
against SDPA sequence by sequence (forward and the gradients of q, k, v, bf16), then the attention
of one packed micro-batch as verl builds it (Qwen2-1.5B's heads, the job's token budget) timed three
ways: this kernel, transformers' SDPA with the dense block-diagonal mask (verl's run of 2026-12-06),
and the sequences one by one through SDPA's causal flash path. Prints one JSON line; exit 1 if the
values disagree.

    python3 benchmarks/peers/verl_attn/check_gpu.py [--tokens 36864] [--layers 28] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_varlen  # noqa: E402

HQ, HKV, DIM = 12, 2, 128  # Qwen2-1.5B
DEVICE = "cuda"  # --device cpu: a dry run of this script (the kernel path is then SDPA per segment)


def packed(lengths, dtype, gen):
    total = sum(lengths)
    q = torch.randn(1, HQ, total, DIM, generator=gen, device=DEVICE, dtype=dtype)
    k = torch.randn(1, HKV, total, DIM, generator=gen, device=DEVICE, dtype=dtype)
    v = torch.randn(1, HKV, total, DIM, generator=gen, device=DEVICE, dtype=dtype)
    pos = torch.cat([torch.arange(n, device=DEVICE) for n in lengths]).unsqueeze(0)
    return q, k, v, pos


def one_by_one(q, k, v, lengths):
    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        o = F.scaled_dot_product_attention(q[:, :, s], k[:, :, s], v[:, :, s], is_causal=True, enable_gqa=True)
        outs.append(o.transpose(1, 2))
        start += n
    return torch.cat(outs, dim=1)


def dense_block_mask(q, k, v, lengths):
    """transformers 5.10.4's SDPA path on a packed row: a (T, T) boolean mask, causal within a segment."""
    seg = torch.cat([torch.full((n,), i, device=DEVICE) for i, n in enumerate(lengths)])
    idx = torch.arange(len(seg), device=DEVICE)
    mask = (seg[:, None] == seg[None, :]) & (idx[:, None] >= idx[None, :])
    groups = HQ // HKV
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None]).transpose(1, 2)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def fwd_bwd_seconds(fn, q, k, v, repeats=3):
    for t in (q, k, v):
        t.requires_grad_(True)
    times = []
    for _ in range(repeats + 1):
        _sync()
        t0 = time.perf_counter()
        out = fn(q, k, v)
        out.float().square().mean().backward()
        _sync()
        times.append(time.perf_counter() - t0)
        q.grad = k.grad = v.grad = None
    return sorted(times[1:])[len(times[1:]) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=36864, help="one packed micro-batch (verl's 2 x budget)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    result = {"torch": torch.__version__, "device": name}

    # values: varlen kernel vs SDPA one by one, forward and gradients
    lengths = [300, 1024, 77, 1, 2000, 513]
    q, k, v, pos = packed(lengths, torch.bfloat16, gen)
    grads = []
    for fn in (
        lambda q, k, v: peer_varlen.varlen_attention_forward(None, q, k, v, None, position_ids=pos)[0],
        lambda q, k, v: one_by_one(q, k, v, lengths),
    ):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out = fn(qq, kk, vv)
        out.float().square().mean().backward()
        grads.append([out.detach().float(), qq.grad.float(), kk.grad.float(), vv.grad.float()])
    diffs = {
        name: (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        for name, a, b in zip(("out", "dq", "dk", "dv"), grads[0], grads[1])
    }
    result["relative_max_diff_vs_sdpa_one_by_one"] = diffs
    ok = all(d < 2e-2 for d in diffs.values())

    # time: one packed micro-batch of the job's lengths (prompt ~40 + response up to 1024)
    cpu_gen = torch.Generator().manual_seed(1)
    lengths, total = [], 0
    while total < args.tokens:
        n = min(int(torch.randint(64, 1088, (1,), generator=cpu_gen)), args.tokens - total)
        lengths.append(n)
        total += n
    q, k, v, pos = packed(lengths, torch.bfloat16, gen)
    cases = {
        "varlen": lambda q, k, v: peer_varlen.varlen_attention_forward(None, q, k, v, None, position_ids=pos)[0],
        "sdpa_one_by_one": lambda q, k, v: one_by_one(q, k, v, lengths),
        "sdpa_dense_block_mask": lambda q, k, v: dense_block_mask(q, k, v, lengths),
    }
    per_micro_batch = {}
    for key, fn in cases.items():
        try:
            per_micro_batch[key] = round(fwd_bwd_seconds(fn, q, k, v) * args.layers, 3)
        except torch.OutOfMemoryError:
            per_micro_batch[key] = "out of memory"
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    result.update(
        tokens=total, sequences=len(lengths), layers=args.layers,
        attention_fwd_bwd_s_per_micro_batch=per_micro_batch, ok=ok,
    )
    print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
