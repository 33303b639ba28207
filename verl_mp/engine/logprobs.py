"""Per-token log-probs and entropy from vocab-parallel logits (no rank sees the full vocabulary).

Each TP rank holds ``logits [..., V_local]`` for vocabulary ids
``[tp_rank * V_local, (tp_rank + 1) * V_local)``; ids ``>= vocab_size`` are TP padding and
are excluded from the softmax. The max, the sum of exponentials, the target logit and
``sum exp * logit`` are all-reduced over the TP group (megatron's
``reduce_from_tensor_model_parallel_region``: all-reduce forward, identity backward, which
is the correct gradient because every TP rank computes the same loss from the reduced
values, as long as no rank-local term depends on a reduced value that carries gradient).
Everything is computed in fp32 and is differentiable.

Two implementations, chosen by `verl_mp.kernels.dispatch.select_impl` (``impl=`` argument,
else ``VERL_MP_KERNELS``, else "auto": Triton for CUDA logits, torch otherwise):

- "triton": the fused kernel `verl_mp.kernels.logprob_loss.vocab_parallel_log_probs`
  (streaming forward, fused backward; reads the logits in their own dtype and never
  allocates an fp32 ``[tokens, V_local]`` tensor);
- "torch": `_log_probs_torch` below, the reference (autograd keeps several fp32 copies
  of the logits for the backward).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl_mp.kernels import logprob_loss
from verl_mp.kernels.dispatch import select_impl


def _tp():
    """(group, rank, size) of the TP group; a single rank when megatron is not initialised."""
    from megatron.core import parallel_state as mps

    if not mps.model_parallel_is_initialized():
        return None, 0, 1
    return mps.get_tensor_model_parallel_group(), mps.get_tensor_model_parallel_rank(), \
        mps.get_tensor_model_parallel_world_size()


def _reduce(x: torch.Tensor, tp_size: int, group) -> torch.Tensor:
    if tp_size == 1:
        return x
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x, group=group)


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(targets)`` and optionally the entropy of ``softmax(logits / temperature)``.

    Args:
        logits: ``[..., V_local]`` this TP rank's vocabulary slice (fp32/bf16/fp16).
        targets: ``[...]`` global token ids (any value on positions the caller masks out;
            they must be in ``[0, vocab_size)`` to be meaningful).
        vocab_size: the unpadded vocabulary size.
        impl: "torch" | "triton" | "auto" | None (None: ``VERL_MP_KERNELS``, default auto).
    Returns:
        ``(log_probs [...], entropy [...] or None)``, fp32.
    """
    group, tp_rank, tp_size = _tp()
    if select_impl(impl, logits.device) == "triton":
        return logprob_loss.vocab_parallel_log_probs(
            logits.contiguous(), targets.long().contiguous(), compute_entropy=with_entropy,
            tp_group=group if tp_size > 1 else None, vocab_start=tp_rank * logits.shape[-1],
            vocab_size=vocab_size, temperature=temperature, impl="triton")
    return _log_probs_torch(logits, targets, vocab_size, temperature, with_entropy, group, tp_rank, tp_size)


def _log_probs_torch(logits, targets, vocab_size, temperature, with_entropy, group, tp_rank, tp_size):
    """The plain-torch reference of `vocab_parallel_log_probs` (autograd through fp32 copies)."""
    v_local = logits.shape[-1]
    first = tp_rank * v_local
    valid = torch.arange(first, first + v_local, device=logits.device) < vocab_size
    x = logits.float() / temperature if temperature != 1.0 else logits.float()
    with torch.no_grad():
        local_max = x.masked_fill(~valid, float("-inf")).amax(dim=-1)
        if tp_size > 1:
            dist.all_reduce(local_max, op=dist.ReduceOp.MAX, group=group)
    # Padded ids: shifted set to 0 and exp to 0, so they add nothing (not even NaN/inf from
    # arbitrary logits) to the softmax, and receive zero gradient.
    shifted = (x - local_max.unsqueeze(-1)).masked_fill(~valid, 0.0)
    exp = torch.exp(shifted).masked_fill(~valid, 0.0)
    sum_exp = _reduce(exp.sum(dim=-1), tp_size, group)
    log_z = torch.log(sum_exp)
    local_ids = targets - first
    mine = (local_ids >= 0) & (local_ids < v_local)
    picked = shifted.gather(-1, local_ids.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)
    target_shifted = _reduce(picked * mine, tp_size, group)
    log_probs = target_shifted - log_z
    if not with_entropy:
        return log_probs, None
    # H = log Z - sum(exp * shifted) / Z. Reduce first, then divide: everything after a
    # reduction must be the same on every TP rank for its identity backward to be right
    # (sum(exp / Z * shifted) with the reduced Z inside a rank-local sum is not).
    entropy = log_z - _reduce((exp * shifted).sum(dim=-1), tp_size, group) / sum_exp
    return log_probs, entropy
