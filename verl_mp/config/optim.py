"""Optimizer and learning-rate schedule settings for a Megatron engine."""

from __future__ import annotations

from dataclasses import dataclass

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate (after warm-up)."""
    min_lr: float = 0.0
    """Learning rate at the end of decay."""
    lr_warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to ``lr``."""
    lr_decay_style: str = "constant"
    """One of constant, linear, cosine, inverse-square-root."""
    lr_decay_steps: int | None = None
    """Steps over which to decay; None means the trainer's total step count."""
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    """Global gradient-norm clip; 0 disables clipping."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (megatron DistributedOptimizer)."""

    def __post_init__(self) -> None:
        if self.lr_decay_style not in LR_DECAY_STYLES:
            raise ValueError(
                f"optim.lr_decay_style={self.lr_decay_style!r} is not one of {LR_DECAY_STYLES}"
            )
        if self.lr < 0 or self.min_lr < 0 or self.min_lr > max(self.lr, 0.0):
            raise ValueError(f"optim.lr={self.lr} and optim.min_lr={self.min_lr} need 0 <= min_lr <= lr")
