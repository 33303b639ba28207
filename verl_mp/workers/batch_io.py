"""The one place where `RLBatch` meets the engines' layout.

RL quantities are per response token, ``[B, T]`` (`verl_mp.data.rl_batch`); Megatron
engines read and write per next-token position, ``[B, S]`` (`verl_mp.engine.engine`).
`engine_inputs` converts a batch (and the per-token fields a loss reads) once;
`response_values` converts an engine output back. `train_epochs` runs PPO-style epochs
of mini-batch optimizer steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl_mp.data.rl_batch import RLBatch, attention_mask, to_positions
from verl_mp.engine.engine import MegatronEngine

LossFactory = Callable[[float, float, int], Callable]
"""``(global_tokens, global_seqs, max_response_len) -> engine loss_fn``."""


def engine_inputs(batch: RLBatch, fields: list[str] = (), routing: bool = False) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``response_mask`` and ``fields`` as ``[B, S]``; with
    ``routing`` the batch's ``routed_experts [B, S, L, k]`` (already per position), which the
    engine replays."""
    inputs = {"input_ids": batch.input_ids, "attention_mask": attention_mask(batch),
              "response_mask": to_positions(batch, batch.response_mask)}
    inputs.update({f: to_positions(batch, getattr(batch, f)) for f in fields})
    if routing:
        inputs["routed_experts"] = batch.routed_experts
    return inputs


def response_values(batch: RLBatch, per_position: torch.Tensor) -> torch.Tensor:
    """An engine output ``[B, S]`` -> ``[B, T]`` at the response tokens (CPU, 0 on padding)."""
    return batch.gather_response(per_position)


def train_epochs(engine: MegatronEngine, batch: RLBatch, fields: list[str], *, epochs: int,
                 mini_batch_size: int, prefix: str, make_loss: LossFactory, routing: bool = False,
                 **step_kwargs) -> dict[str, float]:
    """``epochs`` passes over ``batch`` in mini-batches of ``mini_batch_size`` rows, one
    optimizer step each; returns ``{prefix}/<metric>`` averaged over the steps.

    ``fields``: the ``[B, T]`` tensors the loss reads. Losses are normalised by each
    mini-batch's global counts (all micro-batches and data-parallel ranks). ``routing``: the
    steps replay the batch's ``routed_experts``.
    """
    sums: dict[str, float] = {}
    count = 0
    for _ in range(epochs):
        for part in batch.chunks(mini_batch_size):
            global_tokens = float(part.response_mask.sum().clamp(min=1))
            global_seqs = float((part.response_lengths > 0).sum().clamp(min=1))
            loss_fn = make_loss(global_tokens, global_seqs, part.responses.shape[1])
            for k, v in engine.train_step(engine_inputs(part, fields, routing), loss_fn, **step_kwargs).items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
    return {f"{prefix}/{k}": v / max(count, 1) for k, v in sums.items()}
