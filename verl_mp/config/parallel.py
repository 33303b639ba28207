"""Parallel layout settings and the checks that must pass before any process starts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class ParallelConfig:
    """How one Megatron engine (actor, reference or critic) is split over ranks.

    The data-parallel size is not set here: it is derived as
    ``world_size // (tensor_model_parallel_size * pipeline_model_parallel_size)``.
    """

    tensor_model_parallel_size: int = 1
    """Ranks that split every linear layer (Megatron TP). Must divide the attention heads
    and the KV heads (query groups)."""

    pipeline_model_parallel_size: int = 1
    """Pipeline stages (Megatron PP). Must divide the number of layers (times the
    virtual pipeline size, when set)."""

    virtual_pipeline_model_parallel_size: int | None = None
    """Model chunks per pipeline stage (interleaved 1F1B); None disables interleaving."""

    sequence_parallel: bool = False
    """Megatron sequence parallelism inside TP groups (needs TP > 1; required for training a
    mixture-of-experts model at TP > 1)."""

    expert_model_parallel_size: int = 1
    """Ranks that split the routed experts of every MoE layer (Megatron EP): each holds
    ``num_experts / EP`` of them and tokens travel to their experts' ranks. Must divide the
    number of experts, and EP x expert-TP x PP must divide the world size. Mixture-of-experts
    models only (a dense model refuses EP > 1)."""

    expert_tensor_parallel_size: int | None = None
    """Ranks that split each routed expert's linears (Megatron expert-TP); None: the same as
    ``tensor_model_parallel_size`` (megatron's default). Must divide the expert
    intermediate size. Ignored by dense models."""

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    @property
    def expert_tp_size(self) -> int:
        """The effective expert-TP size (``expert_tensor_parallel_size`` or, when None, TP)."""
        etp = self.expert_tensor_parallel_size
        return self.tensor_model_parallel_size if etp is None else etp


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The few model dimensions that decide which parallel layouts are legal."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    num_experts: int | None = None
    """Routed experts per MoE layer; None for a dense model."""
    moe_ffn_hidden_size: int | None = None
    """Intermediate size of one routed expert (MoE only)."""


def validate_layout(
    parallel: ParallelConfig, world_size: int, shape: ModelShape | None = None, prefix: str = "",
    *, trainable: bool = True,
) -> int:
    """Check a layout against the world size and model shape; return the DP size.

    Raises ValueError naming the setting and the fix. ``prefix`` names the config
    section (e.g. ``"actor.megatron."``) in messages. ``trainable=False`` (forward-only
    engines: verify, convert, a reference policy) skips what only training needs.
    """
    tp = parallel.tensor_model_parallel_size
    pp = parallel.pipeline_model_parallel_size
    vpp = parallel.virtual_pipeline_model_parallel_size
    for name, value in (
        ("tensor_model_parallel_size", tp),
        ("pipeline_model_parallel_size", pp),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}{name}={value!r} must be a positive integer")
    if world_size % (tp * pp) != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by {prefix}tensor_model_parallel_size="
            f"{tp} x {prefix}pipeline_model_parallel_size={pp}; choose sizes whose product "
            f"divides the number of ranks"
        )
    if parallel.sequence_parallel and tp == 1:
        raise ValueError(f"{prefix}sequence_parallel=True needs tensor_model_parallel_size > 1")
    if vpp is not None and (vpp < 1 or pp == 1):
        raise ValueError(
            f"{prefix}virtual_pipeline_model_parallel_size={vpp} needs "
            f"pipeline_model_parallel_size > 1 (got {pp}); set it to null to disable"
        )
    _validate_expert_layout(parallel, world_size, prefix)
    if shape is not None:
        _validate_against_shape(tp, pp * (vpp or 1), shape, prefix)
        _validate_experts_against_shape(parallel, shape, prefix, trainable)
    return world_size // (tp * pp)


def _validate_expert_layout(parallel: ParallelConfig, world_size: int, prefix: str) -> None:
    ep, etp, pp = parallel.expert_model_parallel_size, parallel.expert_tp_size, parallel.pipeline_model_parallel_size
    for name, value in (("expert_model_parallel_size", ep), ("expert_tensor_parallel_size", etp)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}{name}={value!r} must be a positive integer")
    if world_size % (etp * ep * pp) != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by {prefix}expert_tensor_parallel_size={etp} x "
            f"{prefix}expert_model_parallel_size={ep} x {prefix}pipeline_model_parallel_size={pp}; "
            f"choose expert sizes whose product with PP divides the number of ranks"
        )


def _validate_experts_against_shape(parallel: ParallelConfig, shape: ModelShape, prefix: str,
                                    trainable: bool) -> None:
    ep, etp, tp = parallel.expert_model_parallel_size, parallel.expert_tp_size, parallel.tensor_model_parallel_size
    if shape.num_experts is None:
        if ep > 1:
            raise ValueError(f"{prefix}expert_model_parallel_size={ep} needs a mixture-of-experts model; "
                             f"this one is dense: set it to 1")
        return
    if shape.num_experts % ep != 0:
        raise ValueError(f"{prefix}expert_model_parallel_size={ep} must divide the number of experts "
                         f"({shape.num_experts}); use an EP that divides it")
    if shape.moe_ffn_hidden_size is not None and shape.moe_ffn_hidden_size % etp != 0:
        raise ValueError(f"{prefix}expert_tensor_parallel_size={etp} must divide the expert intermediate "
                         f"size ({shape.moe_ffn_hidden_size}); use an expert-TP that divides it")
    if trainable and ep == 1 and etp != tp:
        # megatron-core 0.16 marks expert weights as expert-parallel only when EP > 1; at EP = 1
        # it reduces their gradients over the attention data-parallel group, which is wrong
        # when the experts are split (or replicated) differently from attention.
        raise ValueError(f"{prefix}expert_tensor_parallel_size={etp} differs from "
                         f"{prefix}tensor_model_parallel_size={tp} at {prefix}expert_model_parallel_size=1; "
                         f"megatron then reduces expert gradients over the wrong ranks: use EP > 1 or "
                         f"leave expert_tensor_parallel_size unset")
    if trainable and tp > 1 and not parallel.sequence_parallel:
        # megatron's MoELayer refuses to train at TP > 1 without sequence parallelism.
        raise ValueError(f"training a mixture-of-experts model at {prefix}tensor_model_parallel_size={tp} "
                         f"needs {prefix}sequence_parallel=true")


def _validate_against_shape(tp: int, num_chunks: int, shape: ModelShape, prefix: str) -> None:
    if shape.num_attention_heads % tp != 0:
        raise ValueError(
            f"{prefix}tensor_model_parallel_size={tp} must divide "
            f"num_attention_heads={shape.num_attention_heads}"
        )
    if shape.num_query_groups % tp != 0:
        raise ValueError(
            f"{prefix}tensor_model_parallel_size={tp} must divide the KV heads "
            f"(num_key_value_heads={shape.num_query_groups}); use a TP that divides it"
        )
    if shape.num_layers % num_chunks != 0:
        raise ValueError(
            f"num_layers={shape.num_layers} is not divisible by {prefix}"
            f"pipeline_model_parallel_size x virtual size = {num_chunks}"
        )
