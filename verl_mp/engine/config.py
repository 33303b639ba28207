"""Settings of one megatron engine (actor, reference policy or critic)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_mp.config.moe import MoEConfig
from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.utils.dtypes import TRAIN_DTYPES, check_dtype

ROLES = ("actor", "ref", "critic")


@dataclass(kw_only=True)
class EngineConfig:
    model_path: str = "???"
    """HF checkpoint directory (config.json + safetensors, optionally sharded with an index)."""
    role: str = "actor"
    """``actor`` (log-probs + training), ``ref`` (forward-only, no optimizer) or ``critic``
    (value head on the backbone, training)."""
    dtype: str = "fp32"
    """Parameter/compute dtype: ``fp32`` or ``bf16`` (bf16 keeps fp32 main weights and Adam state)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    """Router losses and token dispatch of a mixture-of-experts model (ignored when dense)."""
    total_training_steps: int = 1
    """Optimizer steps of the whole run (the LR schedule's horizon when optim.lr_decay_steps is None)."""
    micro_batch_size: int | None = 1
    """Rows per micro-batch (used when max_tokens_per_micro_batch is None)."""
    max_tokens_per_micro_batch: int | None = None
    """Dynamic batch size: micro-batches filled up to this many tokens (padded tokens count
    unless remove_padding). Overrides micro_batch_size."""
    remove_padding: bool = False
    """Pack each micro-batch's sequences back to back (THD); needs attention_backend sdpa/te."""
    attention_backend: str = "auto"
    """``auto`` (te if importable, else sdpa), ``te``, ``sdpa`` or ``local`` (megatron's unfused)."""
    recompute: str = "none"
    """Activation recompute: ``none``, ``selective`` (core attention) or ``full`` (whole
    layers, ``recompute_num_layers`` per checkpoint, megatron's uniform method)."""
    recompute_modules: list[str] = field(default_factory=lambda: ["mlp"])
    """With ``recompute="selective"``: megatron's module names (``mlp``, ``core_attn``)."""
    recompute_num_layers: int = 1
    offload_params: bool = False
    """Between uses, keep parameters on CPU (ref policy; actor/critic colocated with rollout)."""
    offload_grads: bool = False
    """Between train steps, free the gradient buffers."""
    offload_optimizer: bool = False
    """Between train steps, keep optimizer state (fp32 main weights, Adam moments) on CPU."""
    seed: int = 1234
    """Seeds megatron's RNG tracker (dropout; initial weights before a checkpoint is loaded).
    A critic's fresh value head is drawn from a fixed seed (`ValueHead`)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"engine.role={self.role!r} is not one of {ROLES}")
        check_dtype("engine.dtype", self.dtype, TRAIN_DTYPES)
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"engine.micro_batch_size={self.micro_batch_size} must be >= 1")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ValueError(f"engine.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} must be >= 1")
        if self.micro_batch_size is None and self.max_tokens_per_micro_batch is None:
            raise ValueError("set engine.micro_batch_size or engine.max_tokens_per_micro_batch")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"engine.recompute={self.recompute!r} is not one of ('none', 'selective', 'full')")
        if self.remove_padding and self.attention_backend == "local":
            raise ValueError("engine.remove_padding=True needs attention_backend 'sdpa', 'te' or 'auto' "
                             "(megatron's local attention refuses packed sequences)")

    @property
    def trainable(self) -> bool:
        return self.role != "ref"
