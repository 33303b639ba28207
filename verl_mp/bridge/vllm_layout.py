"""One Megatron TP shard -> vLLM's own parameter shard for the same TP rank (pure tensors).

The weight-sync fast path (``rollout.weight_sync_mode=local``, training TP == rollout TP)
writes each rank's Megatron shards straight into its vLLM worker's parameters, with no
TP communication. vLLM's dense-model parameters on one TP rank, and how they relate to
that rank's Megatron shard (same TP rank, same split dimension):

==========================================  ===============================================
vLLM parameter (Llama/Qwen2/Qwen3/Mistral)  from the Megatron shard
==========================================  ===============================================
``...self_attn.qkv_proj.{weight,bias}``     ``linear_qkv`` holds whole query groups
                                            interleaved ``[q_g; k_g; v_g]``; vLLM wants
                                            ``[q_r; k_r; v_r]``: a local permutation
``...mlp.gate_up_proj.weight``              ``linear_fc1`` is ``[gate_r; up_r]`` already
``...o_proj.weight``, ``...down_proj.weight``  the same column slice
norms, ``q_norm``/``k_norm``                  replicated, copied
``model.embed_tokens.weight``, ``lm_head``  rows ``[r * R, (r + 1) * R)`` with
                                            ``R = pad(vocab, 64) / tp`` in vLLM and
                                            ``pad(vocab, tp) / tp`` in Megatron
==========================================  ===============================================

When the two vocabulary paddings give different row ranges (a vocabulary that is not a
multiple of 64, e.g. the tiny test models), the vocabulary tensors alone are gathered
inside the TP group and sliced (`vllm_vocab_rows`); every other tensor moves rank-locally.
vLLM ties ``lm_head`` to ``embed_tokens`` when the config does, so a tied head is skipped.

The same rules twice: as new tensors (`megatron_shard_to_vllm`, `vllm_vocab_rows`: the
bucketed stream) and as ``(vLLM view, shard view)`` pairs of equal shape (`shard_copy_pairs`,
`vocab_copy_pairs`: the direct copy, `WeightSync.copy_into`, which allocates nothing).
"""

from __future__ import annotations

import torch

from verl_mp.models.convert import hf_names, is_tied_copy, match_rule, split_qkv
from verl_mp.models.spec import GPTSpec, padded_vocab_size

VLLM_VOCAB_PADDING = 64
"""vLLM's ``DEFAULT_VOCAB_PADDING_SIZE`` (unchanged from 0.26 through 0.32)."""

_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def vllm_param_name(hf_name: str) -> str:
    """The vLLM parameter an HF tensor loads into (``q_proj`` -> ``qkv_proj`` ...)."""
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        parts[-2] = _FUSED[parts[-2]]
    return ".".join(parts)


def vllm_vocab_rows_per_rank(vocab_size: int, tp_size: int) -> int:
    padded = padded_vocab_size(vocab_size, 1, VLLM_VOCAB_PADDING)
    if padded % tp_size:
        raise ValueError(f"vLLM cannot split a vocabulary padded to {padded} over TP={tp_size}")
    return padded // tp_size


def vocab_needs_gather(spec: GPTSpec, tp_size: int) -> bool:
    """True when Megatron's and vLLM's per-rank vocabulary rows differ."""
    return padded_vocab_size(spec.vocab_size, tp_size) // tp_size != vllm_vocab_rows_per_rank(spec.vocab_size, tp_size)


def is_vocab(spec: GPTSpec, megatron_name: str) -> bool:
    return match_rule(spec, megatron_name)[0].kind == "vocab"


def megatron_shard_to_vllm(spec: GPTSpec, megatron_name: str, shard: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """This TP rank's Megatron shard -> ``[(vllm_name, tensor)]`` for the same TP rank.

    Vocabulary shards are taken as is: callers use this only when `vocab_needs_gather` is
    False (otherwise `vllm_vocab_rows` on the gathered tensor). Works on meta tensors
    (shape planning).
    """
    if is_tied_copy(spec, megatron_name):
        return []
    rule, _ = match_rule(spec, megatron_name)
    names = hf_names(spec, megatron_name)
    target = vllm_param_name(names[0])
    if rule.kind == "qkv":
        return [(target, torch.cat(split_qkv(shard, spec), dim=0))]
    return [(target, shard)]


def vllm_vocab_rows(spec: GPTSpec, megatron_name: str, full: torch.Tensor, tp_rank: int,
                    tp_size: int) -> list[tuple[str, torch.Tensor]]:
    """vLLM's vocabulary rows for ``tp_rank`` from the TP-gathered (Megatron-padded) tensor;
    rows past the real vocabulary are zero, as vLLM's loader leaves them."""
    if is_tied_copy(spec, megatron_name):
        return []
    rows = vllm_vocab_rows_per_rank(spec.vocab_size, tp_size)
    start = tp_rank * rows
    stop = min(start + rows, spec.vocab_size)
    out = full.new_zeros((rows, *full.shape[1:]))
    if stop > start:
        out[: stop - start].copy_(full[start:stop])
    return [(vllm_param_name(hf_names(spec, megatron_name)[0]), out)]


def shard_copy_pairs(spec: GPTSpec, megatron_name: str, shard: torch.Tensor,
                     params: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`megatron_shard_to_vllm` as ``(view of vLLM's parameter, view of the shard)`` pairs of
    equal shape: copying each pair writes the parameter, with no tensor in between. The
    query-group interleaving of ``linear_qkv`` becomes three strided copies, one per q/k/v."""
    if is_tied_copy(spec, megatron_name):
        return []
    rule, _ = match_rule(spec, megatron_name)
    dst = params[vllm_param_name(hf_names(spec, megatron_name)[0])]
    if rule.kind != "qkv":
        return [(dst, shard)]
    d, hpg = spec.head_dim, spec.heads_per_group
    tail = tuple(shard.shape[1:])
    groups = shard.shape[0] // ((hpg + 2) * d)
    grouped = shard.view(groups, (hpg + 2) * d, *tail)  # per query group: [its q heads; k; v]
    pairs, row = [], 0
    for start, width in ((0, hpg * d), (hpg * d, d), ((hpg + 1) * d, d)):  # vLLM: [all q; all k; all v]
        pairs.append((dst[row: row + groups * width].view(groups, width, *tail), grouped[:, start: start + width]))
        row += groups * width
    return pairs


def vocab_copy_pairs(spec: GPTSpec, megatron_name: str, whole: torch.Tensor, params: dict[str, torch.Tensor]
                     ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor]]:
    """`vllm_vocab_rows` at TP = 1 (the shard is the whole vocabulary) as copy pairs, and the
    rows past the real vocabulary that must be zeroed."""
    if is_tied_copy(spec, megatron_name):
        return [], []
    dst = params[vllm_param_name(hf_names(spec, megatron_name)[0])]
    n = spec.vocab_size
    return [(dst[:n], whole[:n])], ([dst[n:]] if dst.shape[0] > n else [])
