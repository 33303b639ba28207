"""What every engine-hosting worker shares: building an engine's config from the run
config, and PPO-style epochs of mini-batch updates over an `RLBatch`."""

from __future__ import annotations

from collections.abc import Callable

from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.schema import RootConfig
from verl_mp.data.rl_batch import RLBatch, attention_mask, to_positions
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine

LossFactory = Callable[[float, float, int], Callable]
"""``(global_tokens, global_seqs, max_response_len) -> engine loss_fn``."""


def engine_config(cfg: RootConfig, role: str, parallel: ParallelConfig) -> EngineConfig:
    section = {"actor": cfg.actor, "ref": cfg.ref, "critic": cfg.critic}[role]
    epochs = cfg.critic.ppo_epochs if role == "critic" else cfg.actor.ppo_epochs
    steps_per_rl_step = epochs * (cfg.data.train_batch_size // cfg.actor.ppo_mini_batch_size)
    return EngineConfig(
        model_path=cfg.model.path, role=role, dtype=cfg.model.dtype, parallel=parallel,
        optim=section.optim, total_training_steps=max(1, cfg.trainer.total_steps * steps_per_rl_step),
        micro_batch_size=section.micro_batch_size,
        max_tokens_per_micro_batch=section.max_tokens_per_micro_batch,
        attention_backend="auto", seed=cfg.trainer.seed,
    )


def train_epochs(engine: MegatronEngine, batch: RLBatch, fields: list[str], *, epochs: int,
                 mini_batch_size: int, prefix: str, make_loss: LossFactory, **step_kwargs) -> dict[str, float]:
    """``epochs`` passes over ``batch`` in mini-batches of ``mini_batch_size`` rows, one
    optimizer step each; returns ``{prefix}/<metric>`` averaged over the steps.

    ``fields``: the ``[B, T]`` RLBatch tensors the loss reads (moved to the engine's
    ``[B, S]`` next-token positions). Losses are normalised by the mini-batch's counts.
    """
    sums: dict[str, float] = {}
    count = 0
    for _ in range(epochs):
        for part in batch.chunks(mini_batch_size):
            inputs = {"input_ids": part.input_ids, "attention_mask": attention_mask(part),
                      "response_mask": to_positions(part, part.response_mask)}
            inputs.update({f: to_positions(part, getattr(part, f)) for f in fields})
            global_tokens = float(part.response_mask.sum().clamp(min=1))
            global_seqs = float((part.response_lengths > 0).sum().clamp(min=1))
            loss_fn = make_loss(global_tokens, global_seqs, part.responses.shape[1])
            for k, v in engine.train_step(inputs, loss_fn, **step_kwargs).items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    return {f"{prefix}/{k}": v / max(count, 1) for k, v in sums.items()}


def mini_batch_rows(cfg: RootConfig) -> int:
    """Rows (samples) per optimizer step: ppo_mini_batch_size prompts x n samples."""
    return cfg.actor.ppo_mini_batch_size * cfg.rollout.sampling.n
