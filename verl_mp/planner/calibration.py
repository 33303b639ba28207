"""The planner against measured GPU peaks of the engine's train step.

`MEASUREMENTS` lists peaks of `MegatronEngine.train_step` (``torch.cuda.max_memory_allocated``
in steady state: Adam state allocated by a warm-up step) measured on NVIDIA H200s;
`planned_peak` computes the same quantity from the planner's formulas: the engine's static
state plus its train-step activations and LM-head term. ``python -m
verl_mp.planner.calibration`` prints the comparison table of benchmarks/RESULTS.md;
tests/unit/test_planner_calibration.py asserts it (within `TOLERANCE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_mp.planner import memory as mem
from verl_mp.planner.dims import Layout, ModelDims
from verl_mp.planner.engines import EngineUse, MicroBatchShape, train_micro_batches

GIB = 2**30
TOLERANCE = 0.15
H200_GIB = 140.4
"""143771 MiB as the driver reports it."""

SHAPES = {
    # Qwen2-1.5B: hidden 1536, 28 layers, 12/2 heads, FFN 8960, vocab 151936 tied
    "qwen2-1.5b": ModelDims(num_layers=28, hidden=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960,
                            vocab=151936, tied=True, qkv_bias=True),
}


@dataclass(frozen=True, kw_only=True)
class Measurement:
    shape: str
    rows: int
    """Rows of the train step's batch (one optimizer step)."""
    seq: int
    micro_batch: int
    impl: str = "fused"
    """The kernel path: ``fused`` (log-prob op, RMSNorm and SwiGLU in Triton) or ``torch``."""
    recompute: mem.Recompute = mem.Recompute()
    dtype: str = "bf16"
    measured_gib: float | None
    """Peak allocated; None when the step ran out of memory."""
    oom_in_use_gib: float | None = None
    """For out-of-memory runs: what was in use when the allocation failed (a lower bound)."""
    source: str


MEASUREMENTS = (
    # benchmarks/train_mfu.py with the fused RMSNorm/SwiGLU (results/train_mfu_fused_layers_qwen2_1.5b.json).
    # The 2026-12-01 peaks (89.4 GiB at micro-batch 4, 58.0 at 2, 121.4 with the torch log-prob op,
    # out of memory at 8; benchmarks/RESULTS.md) were of megatron's own SwiGLU, which kept one more
    # [tokens, ffn] tensor: the engine no longer builds that layer, so they are history, not calibration.
    Measurement(shape="qwen2-1.5b", rows=16, seq=4096, micro_batch=4, measured_gib=68.8,
                source="H200, megatron-core 0.16.1, 2026-12-02"),
    Measurement(shape="qwen2-1.5b", rows=16, seq=4096, micro_batch=8, measured_gib=111.0,
                source="H200, megatron-core 0.16.1, 2026-12-02"),
    Measurement(shape="qwen2-1.5b", rows=16, seq=4096, micro_batch=2, measured_gib=47.6,
                source="H200, megatron-core 0.16.1, 2026-12-02"),
    Measurement(shape="qwen2-1.5b", rows=16, seq=4096, micro_batch=8, measured_gib=65.1,
                recompute=mem.Recompute(granularity="selective", modules=("mlp",)),
                source="H200, megatron-core 0.16.1, 2026-12-02"),
)


def planned_peak(m: Measurement, dims: ModelDims | None = None) -> int:
    """Planned peak bytes of one train step on one GPU (TP = PP = DP = 1)."""
    dims = dims or SHAPES[m.shape]
    micro = MicroBatchShape(rows=m.micro_batch, seq=m.seq)
    layout = Layout()
    engine = EngineUse(role="actor", dims=dims, layout=layout, dtype=m.dtype, micro=micro,
                       train_micro_batches=train_micro_batches(m.rows, layout.dp, micro), recompute=m.recompute)
    return engine.state(0).total + sum(engine.train_peak(0, m.impl).values())


def table() -> str:
    """Markdown rows: measured vs planned and the relative error."""
    lines = ["| shape | batch | micro-batch | kernels | recompute | measured GiB | planned GiB | error |",
             "|---|---|---|---|---|---|---|---|"]
    for m in MEASUREMENTS:
        planned = planned_peak(m) / GIB
        if m.measured_gib is None:
            measured, err = f"OOM ({m.oom_in_use_gib} in use)", f"plan > {H200_GIB} GiB: {planned > H200_GIB}"
        else:
            measured, err = f"{m.measured_gib}", f"{(planned - m.measured_gib) / m.measured_gib:+.1%}"
        lines.append(f"| {m.shape} | {m.rows} x {m.seq} | {m.micro_batch} | {m.impl} | "
                     f"{m.recompute.granularity or 'none'} | {measured} | {planned:.1f} | {err} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
