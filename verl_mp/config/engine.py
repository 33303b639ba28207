"""The settings of one Megatron engine, defined once.

`EngineSettings` is what a user sets per engine role; the run configuration's ``actor`` and
``critic`` sections are these plus their role's own keys (`verl_mp.config.schema.EngineRoleConfig`),
``ref`` is the part a frozen engine uses (`ForwardSettings` and its parameters' offload:
`verl_mp.config.schema.ReferenceConfig`), the engine's `verl_mp.engine.config.EngineConfig`
is these plus what the run decides (model, dtype, layout, horizon), the plan copies them by
name (`verl_mp.plan`), the memory planner reads them from the plan, and the resume check
reads from each field's metadata whether it may change between a run and its resume. A new
engine setting is one field here plus its use in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from verl_mp.config.optim import OptimConfig

MAY_DIFFER_ON_RESUME = {"resume": "may_differ"}
"""Field metadata: the setting changes how a step runs, not what it computes (layouts, memory,
speed), so a resumed run may change it (`verl_mp.trainer.resume_check`)."""

ATTENTION_BACKENDS = ("auto", "te", "sdpa", "local")
RECOMPUTE_MODES = ("none", "selective", "full")
RECOMPUTE_MODULES = ("mlp", "core_attn")


@dataclass(kw_only=True)
class ParamOffloadConfig:
    """What of a frozen engine (the reference policy) leaves the device while other phases run
    (GPU only; a no-op on CPU)."""

    params: bool = False
    """Parameters, offloaded while the rollout generates (true by default for the reference
    policy: it only runs one forward per step)."""


@dataclass(kw_only=True)
class OffloadConfig(ParamOffloadConfig):
    """What of a trained engine leaves the device while other phases run (GPU only; a no-op on
    CPU): parameters while the rollout generates; gradients and optimizer state between
    updates (they are rebuilt or brought back before the next update)."""

    grads: bool = False
    """The gradient buffers (zeroed at the start of every update anyway)."""
    optimizer: bool = False
    """fp32 main weights and Adam moments (copied back before the next update)."""


DEFAULT_BUDGET_ROWS = 4
"""Without a GPU to plan for, an unset micro-batching gets a token budget of this many
full-length sequences (the worst case of the former default, 4 rows)."""


def default_token_budget(seq: int) -> int:
    """The token budget of an engine role that sets no micro-batching, where no planner chose one."""
    return DEFAULT_BUDGET_ROWS * seq


@dataclass(kw_only=True)
class ForwardSettings:
    """What a user sets for any Megatron engine, a frozen one (the reference policy) included:
    how its passes batch and attend."""

    micro_batch_size: int | None = field(default=None, metadata=MAY_DIFFER_ON_RESUME)
    """Fixed rows: this many sequences per micro-batch on each data-parallel rank, padded to
    the longest. None (default) with ``max_tokens_per_micro_batch`` None: token-budget
    micro-batches whose budget the memory planner chooses for the GPU and the layout
    (`verl_mp.planner.choose`; ``plan.yaml`` and ``verl-mp plan`` show it)."""
    max_tokens_per_micro_batch: int | None = field(default=None, metadata=MAY_DIFFER_ON_RESUME)
    """Token budget: rows sorted by length and packed into micro-batches of at most this many
    tokens (padding counts unless remove_padding); overrides micro_batch_size."""
    remove_padding: bool = field(default=False, metadata=MAY_DIFFER_ON_RESUME)
    """Sequence packing: each micro-batch's sequences back to back without padding (THD);
    needs attention_backend sdpa, te or auto."""
    attention_backend: str = field(default="auto", metadata=MAY_DIFFER_ON_RESUME)
    """Core attention: auto (te if importable, else sdpa), te, sdpa (torch
    scaled_dot_product_attention) or local (megatron's unfused, materialises [s, s])."""

    _section: ClassVar[str] = "engine"
    """The config key of these settings (error messages name it)."""

    def __post_init__(self) -> None:
        k = self._section
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"{k}.attention_backend={self.attention_backend!r} is not one of {ATTENTION_BACKENDS}")
        if self.remove_padding and self.attention_backend == "local":
            raise ValueError(f"{k}.remove_padding=true needs {k}.attention_backend sdpa, te or auto (megatron's "
                             "local attention refuses packed sequences)")
        for name in ("micro_batch_size", "max_tokens_per_micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{k}.{name}={value} must be >= 1")


@dataclass(kw_only=True)
class EngineSettings(ForwardSettings):
    """What a user sets for one Megatron engine that trains (actor, critic): `ForwardSettings`
    plus its optimizer, activation recompute and offload. The engine's `EngineConfig` has all
    of them for every role; a frozen reference policy sets only `ForwardSettings` and its
    parameters' offload (`verl_mp.config.schema.ReferenceConfig`) and gets the defaults of the rest."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    recompute: str = field(default="none", metadata=MAY_DIFFER_ON_RESUME)
    """Activation recompute in training: none (keep every activation), selective (re-run the
    modules of recompute_modules in backward) or full (keep only each layer group's input and
    re-run it: least memory, about a third more compute). `verl-mp plan` shows what each saves."""
    recompute_modules: list[str] = field(default_factory=lambda: ["mlp"], metadata=MAY_DIFFER_ON_RESUME)
    """With recompute=selective: mlp (the SwiGLU MLP, most of a layer's activations) and/or
    core_attn (with the SDPA attention this saves only its log-sum-exp: there is no [s, s]
    score matrix to drop)."""
    recompute_num_layers: int = field(default=1, metadata=MAY_DIFFER_ON_RESUME)
    """With recompute=full: layers per checkpointed group (megatron's uniform method)."""
    offload: OffloadConfig = field(default_factory=OffloadConfig, metadata=MAY_DIFFER_ON_RESUME)

    def __post_init__(self) -> None:
        super().__post_init__()
        k = self._section
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"{k}.recompute={self.recompute!r} is not one of {RECOMPUTE_MODES}")
        bad = sorted(set(self.recompute_modules) - set(RECOMPUTE_MODULES))
        if bad or (self.recompute == "selective" and not self.recompute_modules):
            raise ValueError(f"{k}.recompute_modules={self.recompute_modules}: give one or more of "
                             f"{list(RECOMPUTE_MODULES)} (megatron 0.16's 'layernorm' needs transformer-engine)")
        if self.recompute_num_layers < 1:
            raise ValueError(f"{k}.recompute_num_layers={self.recompute_num_layers} must be >= 1")
