"""Measured vs planned GPU memory of the engine's train step and log-prob pass (one GPU).

    python benchmarks/engine_memory.py --out engine_memory.json [--cases a,b,...]

Each case builds a `MegatronEngine` (actor, bf16, sdpa layer spec, random weights: only a
config.json is written) for a real model shape, runs a warm-up train step (Adam state
allocated, Triton compiled), then records ``torch.cuda.max_memory_allocated`` over one more
train step, and the peak above the allocated baseline of one ``compute_log_probs`` pass.
The planner's numbers for the same settings (`verl_mp.planner.calibration.planned_peak`,
`EngineUse.forward_peak`) go next to them. A case that runs out of memory records what
was allocated. Results: benchmarks/RESULTS.md, "Memory planner".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl_mp.planner import memory as mem  # noqa: E402
from verl_mp.planner.calibration import Measurement, planned_peak  # noqa: E402
from verl_mp.planner.dims import Layout, ModelDims  # noqa: E402
from verl_mp.planner.engines import EngineUse, MicroBatchShape  # noqa: E402

GIB = 2**30
QWEN2_1_5B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536, intermediate_size=8960,
                  num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                  tie_word_embeddings=True)
QWEN3_4B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=2560, intermediate_size=9728,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                vocab_size=151936, tie_word_embeddings=True)
LLAMA_3_2_1B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048, intermediate_size=8192,
                    num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                    tie_word_embeddings=True, rope_theta=500000.0,
                    rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=8192))
TINY = dict(QWEN2_1_5B, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000)
SHAPES = {"qwen2-1.5b": QWEN2_1_5B, "qwen3-4b": QWEN3_4B, "llama3.2-1b": LLAMA_3_2_1B, "tiny": TINY}
# name: (shape, rows, seq, micro-batch, log-prob impl, recompute granularity)
CASES = {
    "q15_mb1": ("qwen2-1.5b", 16, 4096, 1, "fused", None),
    "q15_mb4": ("qwen2-1.5b", 16, 4096, 4, "fused", None),
    "q15_mb4_sel": ("qwen2-1.5b", 16, 4096, 4, "fused", "selective"),
    "q15_mb8_sel": ("qwen2-1.5b", 16, 4096, 8, "fused", "selective"),
    "q15_mb8_full": ("qwen2-1.5b", 16, 4096, 8, "fused", "full"),
    "q15_mb16_full": ("qwen2-1.5b", 16, 4096, 16, "fused", "full"),
    "q15_mb2_torch": ("qwen2-1.5b", 16, 4096, 2, "torch", None),
    "q3_4b_mb1": ("qwen3-4b", 8, 4096, 1, "fused", None),
    "q3_4b_mb2": ("qwen3-4b", 8, 4096, 2, "fused", None),
    "l1b_mb2_s8k": ("llama3.2-1b", 8, 8192, 2, "fused", None),
    "tiny_smoke": ("tiny", 4, 64, 2, "torch", "full"),  # a CPU check of this script (no memory stats)
}


def build_engine(model_dir: Path, micro_batch: int, recompute: str | None):
    from verl_mp.config.optim import OptimConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine

    cfg = EngineConfig(model_path=str(model_dir), role="actor", dtype="bf16", recompute=recompute or "none",
                       micro_batch_size=micro_batch, attention_backend="sdpa",
                       optim=OptimConfig(lr=1e-6, weight_decay=0.0))
    return MegatronEngine(cfg)


def batch(vocab: int, rows: int, seq: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq), generator=g)
    mask = torch.ones(rows, seq, dtype=torch.long)
    return dict(input_ids=ids, attention_mask=mask, response_mask=mask.float(),
                advantages=torch.randn(rows, seq, generator=g))


def loss_fn(total_tokens: float):
    def fn(outputs, mb):
        m = mb["response_mask"]
        loss = -(outputs["log_probs"] * mb["advantages"] * m).sum() / total_tokens
        return loss, {"pg_loss": loss.detach()}
    return fn


def planned(shape: str, rows: int, seq: int, micro: int, impl: str, recompute: str | None) -> dict:
    from verl_mp.models.hf_config import spec_from_hf_config

    dims = ModelDims.from_spec(spec_from_hf_config(SHAPES[shape]))
    rc = mem.Recompute(granularity=recompute, modules=("mlp",) if recompute == "selective" else ())
    m = Measurement(shape=shape, rows=rows, seq=seq, micro_batch=micro, impl=impl, recompute=rc,
                    measured_gib=None, source="")
    engine = EngineUse(role="actor", dims=dims, layout=Layout(), dtype="bf16",
                       micro=MicroBatchShape(rows=micro, seq=seq))
    return {"planned_train_gib": planned_peak(m, dims) / GIB,
            "planned_forward_gib": engine.forward_peak(0, impl) / GIB}


def measure(name: str, tmp: Path) -> dict:
    shape, rows, seq, micro, impl, recompute = CASES[name]
    model_dir = tmp / shape
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(SHAPES[shape]))
    os.environ["VERL_MP_KERNELS"] = "triton" if impl == "fused" else "torch"
    res = {"case": name, "shape": shape, "rows": rows, "seq": seq, "micro_batch": micro, "impl": impl,
           "recompute": recompute, **planned(shape, rows, seq, micro, impl, recompute)}
    engine = None
    try:
        engine = build_engine(model_dir, micro, recompute)
        b = batch(SHAPES[shape]["vocab_size"], rows, seq)
        fn = loss_fn(float(rows * seq))
        engine.train_step(b, fn)  # warm-up: Adam state, Triton compile
        if not torch.cuda.is_available():
            engine.compute_log_probs(b["input_ids"], b["attention_mask"])
            return res
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        engine.train_step(b, fn)
        torch.cuda.synchronize()
        res["train_s"] = time.perf_counter() - start
        res["train_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        res["static_gib"] = torch.cuda.memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        engine.compute_log_probs(b["input_ids"], b["attention_mask"])
        torch.cuda.synchronize()
        res["forward_extra_gib"] = (torch.cuda.max_memory_allocated() - before) / GIB
    except torch.cuda.OutOfMemoryError:
        res["oom_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    finally:
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    from verl_mp.engine.runtime import init_distributed

    init_distributed()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            res = measure(name, Path(tmp))
            results.append(res)
            print(json.dumps(res), flush=True)
            device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
            Path(args.out).write_text(json.dumps({"device": device, "results": results}, indent=1))


if __name__ == "__main__":
    main()
