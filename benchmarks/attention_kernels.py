"""Causal attention forward + backward on one GPU: which of torch's SDPA kernels is fastest.

The engine's ``sdpa`` backend (`verl_mp.models.layer_spec.SDPAttention`) calls
``scaled_dot_product_attention`` with ``enable_gqa``; torch runs GQA only on its
FlashAttention-2 and math kernels. This times, at one layer of the Qwen2-1.5B shape
(12 query heads, 2 key/value heads, head 128, bf16), each kernel torch offers:
FlashAttention-2 with GQA, and FlashAttention-2 / cuDNN / memory-efficient with K and V
expanded to all heads first (the expansion's copy and its backward are counted).

    python benchmarks/attention_kernels.py --out OUT.json [--batch 4 --seq 4096]

Prints one line per kernel: ms for forward + backward, TFLOP/s (causal: 2 x 2 x s^2/2 x
heads x head_dim per sequence forward, 2.5x that backward).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = {
    "flash_gqa": (SDPBackend.FLASH_ATTENTION, False),
    "flash_expanded": (SDPBackend.FLASH_ATTENTION, True),
    "cudnn_expanded": (SDPBackend.CUDNN_ATTENTION, True),
    "efficient_expanded": (SDPBackend.EFFICIENT_ATTENTION, True),
}


def time_case(backend, expand: bool, b: int, s: int, heads: int, kv: int, d: int, repeats: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    k, v = (torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            for _ in range(2))
    grad = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    times = []
    with sdpa_kernel([backend]):
        for _ in range(repeats + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            kk, vv = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v)) if expand else (k, v)
            out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=not expand)
            out.backward(grad)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    fwd = 2 * 2 * a.seq * a.seq / 2 * a.heads * a.head_dim * a.batch
    results = {"shape": vars(a), "torch": torch.__version__, "cases": {}}
    for name, (backend, expand) in CASES.items():
        try:
            ms = time_case(backend, expand, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, a.repeats)
            results["cases"][name] = {"ms": ms, "tflops": 3.5 * fwd / ms / 1e9}
        except RuntimeError as e:  # the kernel refuses this shape/GPU
            results["cases"][name] = {"error": str(e).splitlines()[0][:200]}
        print(name, json.dumps(results["cases"][name]), flush=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
