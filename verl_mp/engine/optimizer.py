"""megatron optimizer (DistributedOptimizer) and LR schedule for an engine's chunks."""

from __future__ import annotations

from verl_mp.config.optim import OptimConfig
from verl_mp.engine.runtime import megatron_scope


def build_optimizer(chunks: list, optim: OptimConfig, dtype: str, total_steps: int):
    """Return ``(optimizer, scheduler)`` for DDP-wrapped ``chunks``.

    ``dtype`` is the model dtype: with bf16/fp16 params the optimizer keeps fp32 main
    weights and fp32 Adam state.
    """
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    config = OptimizerConfig(
        optimizer="adam",
        lr=optim.lr,
        min_lr=optim.min_lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.adam_beta1,
        adam_beta2=optim.adam_beta2,
        adam_eps=optim.adam_eps,
        clip_grad=optim.clip_grad,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        params_dtype=chunks[0].config.params_dtype,
        use_distributed_optimizer=optim.use_distributed_optimizer,
    )
    with megatron_scope():
        optimizer = get_megatron_optimizer(config, chunks)
    decay_steps = max(optim.lr_decay_steps or total_steps, optim.lr_warmup_steps + 1)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if optim.lr_warmup_steps else optim.lr,
        max_lr=optim.lr,
        min_lr=optim.min_lr,
        lr_warmup_steps=optim.lr_warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=optim.lr_decay_style,
        start_wd=optim.weight_decay,
        end_wd=optim.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
    )
    for chunk in chunks:
        chunk.config.grad_scale_func = optimizer.scale_loss
    return optimizer, scheduler
