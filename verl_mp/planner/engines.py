"""One engine role (actor, reference or critic) on its pool: static state and the peaks
of its forward-only and training passes, per pipeline stage.

Built from the engine configs of the run's plan (`verl_mp.plan.RunPlan`, what the ranks
receive): the role's ``micro_batch_size`` or ``max_tokens_per_micro_batch``, the model dtype,
its parallel layout, recompute, offload, the distributed optimizer setting. Rows are padded to the longest row of a micro-batch, so the planner
takes the worst case: every row is ``data.max_prompt_length + max_new_tokens`` long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_mp.config.engine import EngineSettings, OffloadConfig, default_token_budget
from verl_mp.planner import memory as mem
from verl_mp.planner.dims import Layout, ModelDims, stage_layers


@dataclass(frozen=True, kw_only=True)
class MicroBatchShape:
    rows: float
    """Rows per micro-batch (fractional with a token budget: tokens / seq)."""
    seq: int
    """Padded row length (prompt + response tokens)."""

    @property
    def tokens(self) -> float:
        return self.rows * self.seq


@dataclass(frozen=True, kw_only=True)
class EngineUse:
    role: str
    """actor, ref or critic."""
    dims: ModelDims
    layout: Layout
    dtype: str
    micro: MicroBatchShape
    train_micro_batches: int = 1
    """Micro-batches per optimizer step on one DP rank (caps pipeline in-flight counts)."""
    recompute: mem.Recompute = mem.Recompute()
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """What of the engine leaves the device while other phases run (the role's ``offload``)."""
    distributed_optimizer: bool = True
    settings: EngineSettings | None = field(default=None, compare=False)
    """The engine's settings this use was planned from (the plan's `EngineConfig`)."""

    def on_device(self, stage: int, away: bool) -> int:
        """Static bytes on the device; ``away``: during a phase the engine sits out (what
        ``offload`` names is on the host then)."""
        s = self.state(stage)
        if not away:
            return s.total
        o = self.offload
        return s.total - (s.weights if o.params else 0) - (s.grads if o.grads else 0) - (s.optimizer if o.optimizer else 0)

    @property
    def trainable(self) -> bool:
        return self.role != "ref"

    @property
    def p(self) -> int:
        return mem.DTYPE_BYTES[self.dtype]

    def state(self, stage: int) -> mem.StateBytes:
        return mem.engine_state_bytes(self.dims, self.layout, stage, self.dtype, trainable=self.trainable,
                                      distributed_optimizer=self.distributed_optimizer)

    def forward_peak(self, stage: int, impl: str) -> int:
        """Transient bytes of a forward-only pass (log-probs or values): one layer's live
        tensors (bounded by what it would save for backward) or, on the last stage, the
        logits and the log-prob op, whichever is larger."""
        d, lay, tokens = self.dims, self.layout, self.micro.tokens
        layer = mem.full_layer_bytes(d, self.p, lay.tp, lay.sp, fused=impl == "fused") * tokens
        head = 0.0
        if stage == lay.pp - 1:
            head = mem.logits_bytes_per_token(d, self.p, lay.tp, impl=impl, train=False) * tokens
        return int(max(layer, head))

    def train_peak(self, stage: int, impl: str, entropy: bool = False) -> dict[str, int]:
        """``impl``: ``fused`` (the GPU kernel path: fused log-prob op, RMSNorm and SwiGLU) or
        ``torch``.

        Bytes above the static state at the top of a train step: ``activations`` (saved
        by the stage's layers for all in-flight micro-batches, plus one recomputed layer
        under full recompute) and ``lm_head`` (last stage: logits, their gradient and the
        LM head's weight gradient, at the start of the backward of the last micro-batch)."""
        d, lay, p, mb = self.dims, self.layout, self.p, self.micro
        fused = impl == "fused"
        per_mb = stage_layers(d, lay) * mem.layer_bytes_per_micro_batch(d, p, lay.tp, lay.sp, self.recompute,
                                                                       mb.rows, mb.seq, fused)
        per_mb += mem.pipeline_io_bytes_per_token(d, p, lay) * mb.tokens
        acts = mem.in_flight_micro_batches(lay, stage, self.train_micro_batches) * per_mb
        if self.recompute.granularity == "full":
            acts += mem.full_layer_bytes(d, p, lay.tp, lay.sp, fused) * mb.tokens
        head = 0.0
        if stage == lay.pp - 1:
            head = (mem.logits_bytes_per_token(d, p, lay.tp, impl=impl, train=True, entropy=entropy)
                    + mem.final_norm_bytes_per_token(d, p, lay.tp, lay.sp, fused)) * mb.tokens
            head += mem.lm_head_grad_bytes(d, p, lay.tp)
        return {"activations": int(acts), "lm_head": int(head)}

    def optimizer_step_transient(self, stage: int) -> int:
        if not self.trainable:
            return 0
        return mem.adam_step_transient_bytes(self.dims, self.layout, stage, self.distributed_optimizer)


def micro_batch_shape(section, seq: int) -> MicroBatchShape:
    """``section``: `EngineSettings` (micro_batch_size / max_tokens_per_micro_batch). A
    token budget is planned at its worst case: every row full-length."""
    budget = section.max_tokens_per_micro_batch
    if budget is None and section.micro_batch_size is None:  # left to the planner; where none chose: the fallback
        budget = default_token_budget(seq)
    if budget is not None:
        tokens = max(budget, seq)
        return MicroBatchShape(rows=tokens / seq, seq=seq)
    return MicroBatchShape(rows=section.micro_batch_size, seq=seq)


def train_micro_batches(mini_batch_rows: int, dp: int, micro: MicroBatchShape) -> int:
    """Micro-batches one DP rank runs per optimizer step."""
    return max(1, math.ceil(mini_batch_rows / dp / micro.rows))
