"""Routed experts on one GPU: megatron's SequentialMLP loop against `GroupedExperts`
(``moe.grouped_gemm``), for one experts module and for the engine's whole train step.

1. **One MoE layer's experts**, forward + backward, bf16, on synthetic permuted tokens: the
   shape of `benchmarks/gpu_grpo.sh`'s ``SIZE=moe`` body (hidden 1024, 32 experts of 512,
   top-4) and a Qwen3-30B-A3B layer (hidden 2048, 128 experts of 768, top-8), 16,384 tokens,
   with the assignments spread evenly over the experts and skewed (half of them on 4 experts).
   The weights come from an inference engine of a 1-layer model of that shape (megatron's own
   initialisation), made trainable here; TFLOP/s count 6 x 3 x hidden x ffn per assignment.
2. **The engine's train step** (`MegatronEngine.train_step`, the actor's PPO loss) on the
   ``SIZE=moe`` body (16 layers, 0.87B parameters, 0.15B active), ``--rows`` x ``--seq``
   tokens, each way; TFLOP/s on the active matmul parameters (6 x active x tokens + causal
   attention), with the router's load spread (``moe/max_over_mean_load``) of the step.

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/moe_experts.py --out OUT.json
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

SHAPES = {  # hidden, experts, expert FFN, top-k, heads, kv heads
    "gpu_grpo_moe": dict(hidden=1024, experts=32, ffn=512, top_k=4, heads=16, kv=4),
    "qwen3_30b_a3b": dict(hidden=2048, experts=128, ffn=768, top_k=8, heads=32, kv=4),
}
VOCAB = 151936
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: --smoke only (a check that the script runs)
DTYPE = "bf16"  # --smoke: fp32


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def model_dir(root: Path, shape: dict, layers: int) -> str:
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=shape["hidden"], intermediate_size=4 * shape["hidden"], num_hidden_layers=layers,
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"], head_dim=shape["hidden"] // shape["heads"],
        num_experts=shape["experts"], num_experts_per_tok=shape["top_k"], moe_intermediate_size=shape["ffn"],
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=VOCAB,
        max_position_embeddings=8192, tie_word_embeddings=False, architectures=["Qwen3MoeForCausalLM"],
        torch_dtype="bfloat16")
    cfg.save_pretrained(root)
    return str(root)


def engine(path: str, role: str, grouped: bool, micro: int = 4):
    from verl_mp.config.moe import MoEConfig
    from verl_mp.config.optim import OptimConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine

    return MegatronEngine(EngineConfig(model_path=path, role=role, dtype=DTYPE, micro_batch_size=micro,
                                       attention_backend="sdpa", moe=MoEConfig(grouped_gemm=grouped),
                                       optim=OptimConfig(lr=1e-6), total_training_steps=100))


def counts(tokens: int, experts: int, skewed: bool) -> torch.Tensor:
    """Assignments per expert: even, or half of them on the first 4 experts (+-3 each)."""
    if not skewed:
        base = torch.full((experts,), tokens // experts)
    else:
        base = torch.full((experts,), tokens // 2 // (experts - 4))
        base[:4] = tokens // 2 // 4
    base[-1] += tokens - int(base.sum())
    base[0::2] += 3  # counts that are not multiples of 8, as real routing gives
    base[1::2] -= 3
    return base


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def time_experts(module, forward, assignments: torch.Tensor, hidden: int, repeats: int) -> float:
    """Median seconds of ``forward`` (``module``'s, or SequentialMLP's on it) + backward on
    ``assignments`` permuted tokens."""
    total = int(assignments.sum())
    dtype = next(module.parameters()).dtype
    x = torch.randn(total, hidden, device=DEVICE, dtype=dtype, requires_grad=True)
    probs = torch.rand(total, device=DEVICE)
    grad = torch.randn(total, hidden, device=DEVICE, dtype=dtype)
    times = []
    for _ in range(repeats + 2):
        sync()
        start = time.perf_counter()
        y, _ = forward(x, assignments, probs)
        y.backward(grad)
        sync()
        times.append(time.perf_counter() - start)
        x.grad = None
        for p in module.parameters():
            p.grad = None
    return statistics.median(times[2:])


def experts_table(root: Path, tokens: int, repeats: int) -> list[dict]:
    from verl_mp.models.grouped_experts import GroupedExperts, SequentialReference

    rows = []
    for name, shape in SHAPES.items():
        eng = engine(model_dir(root / name, shape, layers=1), "ref", grouped=True)
        module = next(m for c in eng.chunks for m in c.modules() if isinstance(m, GroupedExperts))
        module.requires_grad_(True)
        assignments_total = tokens * shape["top_k"]
        flops = 6 * 3 * shape["hidden"] * shape["ffn"] * assignments_total
        for skewed in (False, True):
            per_expert = counts(assignments_total, shape["experts"], skewed)
            for impl in ("grouped", "sequential"):
                if impl == "grouped":
                    seconds = time_experts(module, module, per_expert.to(DEVICE), shape["hidden"], repeats)
                else:
                    seconds = time_experts(module, SequentialReference(module), per_expert, shape["hidden"], repeats)
                rows.append(dict(shape=name, tokens=tokens, assignments=assignments_total, skewed=skewed,
                                 impl=impl, ms=seconds * 1e3, tflops=flops / seconds / 1e12))
                print(json.dumps({"experts": rows[-1]}), flush=True)
        del eng, module
        gc.collect()
        empty_cache()
    return rows


def step_flops(shape: dict, layers: int, rows: int, seq: int) -> float:
    h, heads, kv, d = shape["hidden"], shape["heads"], shape["kv"], shape["hidden"] // shape["heads"]
    attn = h * d * (heads + 2 * kv) + heads * d * h
    active = layers * (attn + shape["top_k"] * 3 * h * shape["ffn"] + h * shape["experts"]) + VOCAB * h
    return 6 * active * rows * seq + 6 * layers * seq * seq * heads * d * rows


def step_table(root: Path, rows: int, seq: int, micro: int, repeats: int) -> list[dict]:
    from verl_mp.config.schema import ActorConfig
    from verl_mp.workers.losses import actor_loss

    shape, layers = SHAPES["gpu_grpo_moe"], 16
    path = model_dir(root / "step", shape, layers)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (rows, seq), generator=g)
    response = torch.ones(rows, seq)
    response[:, -1] = 0
    data = {"input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.long), "response_mask": response,
            "old_log_probs": -torch.rand(rows, seq, generator=g) * response,
            "advantages": torch.randn(rows, seq, generator=g) * response}
    loss = actor_loss(ActorConfig(entropy_coeff=0.0), float(response.sum()), float(rows), seq)
    out, weights = [], None
    for impl in ("grouped", "sequential"):
        eng = engine(path, "actor", grouped=impl == "grouped", micro=micro)
        if weights is None:  # the same weights both ways (same names): the same routing
            weights = [{k: v.detach().clone() for k, v in c.state_dict().items() if torch.is_tensor(v)}
                       for c in eng.chunks]
        else:
            for chunk, state in zip(eng.chunks, weights, strict=True):
                chunk.load_state_dict(state, strict=False)
            eng.optimizer.reload_model_params()  # the fp32 main copies too (as load_hf does)
        times, metrics = [], {}
        for _ in range(repeats + 1):
            sync()
            start = time.perf_counter()
            metrics = eng.train_step(data, loss)
            sync()
            times.append(time.perf_counter() - start)
        step = statistics.median(times[1:])
        out.append(dict(impl=impl, rows=rows, seq=seq, micro_batch=micro, step_s=step, tokens_per_s=rows * seq / step,
                        tflops=step_flops(shape, layers, rows, seq) / step / 1e12,
                        max_over_mean_load=metrics.get("moe/max_over_mean_load"),
                        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0))
        print(json.dumps({"step": out[-1]}), flush=True)
        del eng
        gc.collect()
        empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=16384, help="tokens of the experts benchmark (x top-k assignments)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-step", action="store_true", help="only the experts table")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, fp32, CPU allowed: checks that the script runs")
    a = p.parse_args()
    if a.smoke:
        global DTYPE
        DTYPE = "fp32"
        for shape in SHAPES.values():
            shape.update(hidden=64, ffn=32, heads=4, kv=2)
    elif DEVICE != "cuda":
        raise SystemExit("moe_experts.py measures GPU kernels: no CUDA device is visible (--smoke runs on CPU)")
    with tempfile.TemporaryDirectory() as tmp:
        result = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
                  "experts": experts_table(Path(tmp), a.tokens, a.repeats)}
        if not a.skip_step:
            result["step"] = step_table(Path(tmp), a.rows, a.seq, a.micro, max(a.repeats // 2, 2))
    Path(a.out).write_text(json.dumps(result, indent=1))
    print("shape | skewed | impl | ms (fwd+bwd) | TFLOP/s")
    for r in result["experts"]:
        print(f"{r['shape']} | {r['skewed']} | {r['impl']} | {r['ms']:.2f} | {r['tflops']:.1f}")
    for r in result.get("step", []):
        print(f"train step {r['rows']}x{r['seq']} micro {r['micro_batch']} | {r['impl']} | {r['step_s']:.3f} s | "
              f"{r['tokens_per_s']:.0f} tok/s | {r['tflops']:.1f} TFLOP/s | load max/mean {r['max_over_mean_load']} | "
              f"peak {r['peak_gib']:.1f} GiB")


if __name__ == "__main__":
    main()
