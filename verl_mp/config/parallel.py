"""Parallel layout settings and the checks that must pass before any process starts."""

from __future__ import annotations

from dataclasses import dataclass, field

RECOMPUTE_GRANULARITIES = ("selective", "full")
RECOMPUTE_MODULES = ("mlp", "core_attn")


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
    """Megatron sequence parallelism inside TP groups (needs TP > 1)."""

    recompute_granularity: str | None = None
    """Activation recomputation in training: None (keep every activation), ``selective``
    (re-run the modules of ``recompute_modules`` in backward) or ``full`` (keep only each
    layer's input and re-run the whole layer: least memory, about a third more compute).
    ``verl-mp plan`` shows what each saves."""

    recompute_modules: list[str] = field(default_factory=lambda: ["mlp"])
    """Modules re-run with ``recompute_granularity=selective``: ``mlp`` (the SwiGLU MLP,
    most of a layer's activations) and/or ``core_attn`` (with the engine's SDPA attention
    this saves only its log-sum-exp: there is no ``[s, s]`` score matrix to drop)."""

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The few model dimensions that decide which parallel layouts are legal."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int


def validate_layout(
    parallel: ParallelConfig, world_size: int, shape: ModelShape | None = None, prefix: str = ""
) -> int:
    """Check a layout against the world size and model shape; return the DP size.

    Raises ValueError naming the setting and the fix. ``prefix`` names the config
    section (e.g. ``"actor.megatron."``) in messages.
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
    _validate_recompute(parallel, prefix)
    if shape is not None:
        _validate_against_shape(tp, pp * (vpp or 1), shape, prefix)
    return world_size // (tp * pp)


def _validate_recompute(parallel: ParallelConfig, prefix: str) -> None:
    gran = parallel.recompute_granularity
    if gran is not None and gran not in RECOMPUTE_GRANULARITIES:
        raise ValueError(f"{prefix}recompute_granularity={gran!r} is not one of {RECOMPUTE_GRANULARITIES} "
                         "(or null for no recomputation)")
    bad = sorted(set(parallel.recompute_modules) - set(RECOMPUTE_MODULES))
    if bad:
        raise ValueError(f"{prefix}recompute_modules has {bad}; valid modules: {list(RECOMPUTE_MODULES)} "
                         "(megatron 0.16's 'layernorm' recompute needs transformer-engine)")
    if gran == "selective" and not parallel.recompute_modules:
        raise ValueError(f"{prefix}recompute_granularity=selective needs at least one of "
                         f"{list(RECOMPUTE_MODULES)} in {prefix}recompute_modules")


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
