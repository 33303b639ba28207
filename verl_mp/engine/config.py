"""Settings of one megatron engine (actor, reference policy or critic): the user's
`EngineSettings` (defined once, `verl_mp.config.engine`) plus what the run decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from verl_mp.config.engine import EngineSettings
from verl_mp.config.moe import MoEConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.roles import ENGINE_ROLES
from verl_mp.utils.dtypes import TRAIN_DTYPES, check_dtype

@dataclass(kw_only=True)
class EngineConfig(EngineSettings):
    model_path: str = "???"
    """HF checkpoint directory (config.json + safetensors, optionally sharded with an index)."""
    role: str = "actor"
    """``actor`` (log-probs + training), ``ref`` (forward-only, no optimizer) or ``critic``
    (value head on the backbone, training)."""
    dtype: str = "fp32"
    """Parameter/compute dtype: ``fp32`` or ``bf16`` (bf16 keeps fp32 main weights and Adam state)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    """Router losses and token dispatch of a mixture-of-experts model (ignored when dense)."""
    total_training_steps: int = 1
    """Optimizer steps of the whole run (the LR schedule's horizon when optim.lr_decay_steps is None)."""
    micro_batch_size: int | None = 1
    """An engine built on its own (``verl-mp verify``, ``convert``, benchmarks) runs one row per
    micro-batch unless told otherwise; a run always passes its role's setting, where the planner
    (or `default_token_budget`) fills an unset micro-batching with a token budget (`verl_mp.plan`)."""
    seed: int = 1234
    """Seeds megatron's RNG tracker (dropout; initial weights before a checkpoint is loaded).
    A critic's fresh value head is drawn from a fixed seed (`ValueHead`)."""

    _section: ClassVar[str] = "engine"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.role not in ENGINE_ROLES:
            raise ValueError(f"engine.role={self.role!r} is not one of {ENGINE_ROLES}")
        check_dtype("engine.dtype", self.dtype, TRAIN_DTYPES)
        if self.micro_batch_size is None and self.max_tokens_per_micro_batch is None:
            raise ValueError("set engine.micro_batch_size or engine.max_tokens_per_micro_batch")

    @property
    def trainable(self) -> bool:
        return self.role != "ref"
