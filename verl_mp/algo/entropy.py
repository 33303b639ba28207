"""Token log-probs and entropy from full-vocabulary logits, and the entropy bonus.

These are the plain-torch references. They process `chunk_tokens` rows at a time so an
fp32 copy of the whole `[tokens, vocab]` logits never exists; for vocab-parallel
(TP-sharded) logits and the fused backward use `verl_mp.kernels.logprob_loss`.
"""

from __future__ import annotations

import torch

from verl_mp.algo.agg import Count, agg_loss


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, *, chunk_tokens: int = 4096
) -> torch.Tensor:
    """log softmax(logits)[label]: logits `[..., V]`, labels `[...]` -> `[...]` fp32."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1)
    out = [
        torch.log_softmax(flat[i : i + chunk_tokens].float(), dim=-1)
        .gather(-1, flat_labels[i : i + chunk_tokens])
        .squeeze(-1)
        for i in range(0, flat.shape[0], chunk_tokens)
    ]
    return (
        torch.cat(out).reshape(labels.shape)
        if out
        else flat.new_zeros(labels.shape, dtype=torch.float32)
    )


def entropy_from_logits(logits: torch.Tensor, *, chunk_tokens: int = 4096) -> torch.Tensor:
    """Entropy of softmax(logits): `[..., V]` -> `[...]` fp32."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for i in range(0, flat.shape[0], chunk_tokens):
        z = flat[i : i + chunk_tokens].float()
        log_p = torch.log_softmax(z, dim=-1)
        out.append(-(log_p.exp() * log_p).sum(-1))
    shape = logits.shape[:-1]
    return torch.cat(out).reshape(shape) if out else flat.new_zeros(shape, dtype=torch.float32)


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    max_response_len: int | None = None,
) -> torch.Tensor:
    """Aggregated entropy `[B, T]` -> 0-dim; the actor loss subtracts
    ``entropy_coeff * entropy_bonus(...)``."""
    return agg_loss(
        entropy,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_len=max_response_len,
    )
