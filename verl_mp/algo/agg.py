"""Loss aggregation over tokens and sequences, invariant to DP size and micro-batching.

Every mode is a weighted sum ``sum(loss_mat * w)`` with per-token weights `w` from
`agg_weights`. The normalisers are *global* counts for one optimizer step:

- ``global_num_tokens``: number of real response tokens (mask sum) in the whole
  mini-batch, summed over all of its micro-batches and all data-parallel ranks
  (and context-parallel ranks, if sequences are split over CP);
- ``global_num_seqs``: number of non-empty sequences (at least one real token),
  counted the same way;
- ``max_response_len``: the configured maximum response length (a constant), used by
  ``seq-mean-token-sum-norm``; micro-batches may be padded to different lengths, so
  the local ``T`` must not be used when micro-batches differ.

A trainer computes the local counts over its micro-batches before the first forward,
all-reduces them (SUM) over the DP group once, and passes them to every loss call. Each
call then returns this micro-batch's share of the global loss, so the gradients must be
*summed* over micro-batches and DP ranks. If the DP gradient reduction averages (as
Megatron DDP does by default), multiply the loss by the DP size before backward.
With the counts left as None, the local counts are used: correct for one micro-batch
on one rank only.
"""

from __future__ import annotations

import torch

from verl_mp.algo.utils import as_float_mask

AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

Count = int | float | torch.Tensor | None


def _count(value: Count, local: torch.Tensor) -> torch.Tensor:
    """Global count as an fp32 tensor (>= 1 so empty batches give loss 0, not NaN)."""
    if value is None:
        value = local
    return torch.as_tensor(value, dtype=torch.float32, device=local.device).clamp(min=1.0)


def agg_weights(
    response_mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    max_response_len: int | None = None,
) -> torch.Tensor:
    """Per-token weights `[B, T]` fp32 such that ``agg_loss = sum(loss_mat * w)``.

    Args:
        response_mask: `[B, T]`, 1 on real tokens.
        mode: one of `AGG_MODES`.
    """
    mask = as_float_mask(response_mask)
    seq_len = mask.sum(-1)
    if mode == "token-mean":
        return mask / _count(global_num_tokens, mask.sum())
    if mode == "token-sum":
        return mask
    num_seqs = _count(global_num_seqs, (seq_len > 0).sum())
    if mode == "seq-mean-token-sum":
        return mask / num_seqs
    if mode == "seq-mean-token-mean":
        return mask / (seq_len.clamp(min=1.0)[:, None] * num_seqs)
    if mode == "seq-mean-token-sum-norm":
        norm_len = max_response_len if max_response_len is not None else mask.shape[-1]
        if norm_len <= 0:
            raise ValueError(f"max_response_len={norm_len} must be positive")
        return mask / (num_seqs * float(norm_len))
    raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")


def agg_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    max_response_len: int | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss `[B, T]` into a 0-dim fp32 loss (see module doc)."""
    if loss_mat.shape != response_mask.shape:
        raise ValueError(
            f"loss_mat shape {tuple(loss_mat.shape)} != response_mask shape "
            f"{tuple(response_mask.shape)}"
        )
    weights = agg_weights(
        response_mask,
        mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
    # where() so that inf/NaN on padding positions cannot leak into the loss.
    return torch.where(weights > 0, loss_mat.float() * weights, 0.0).sum()
