"""A variable-length attention for transformers models, for the peer benchmark's verl run.

verl's default attention is flash-attn's varlen kernel over the packed micro-batch
(`use_remove_padding`). The flash-attn package has no wheel for the GPU image (torch 2.11 / CUDA 13),
and transformers' SDPA path gives the packed row a dense block-diagonal mask (all L x L scores). This
module registers the same kind of kernel under transformers' documented extension point
(`AttentionInterface.register` and `AttentionMaskInterface.register`): torch's own flash-attention
varlen kernel (`torch.nn.attention.varlen.varlen_attn`, FlashAttention-2 inside torch) over the
segments that the position ids mark, as flash-attn's `_flash_attention_forward` finds them.

It is benchmark code, not part of verl_mp; verl itself runs as released. CUDA with bf16/fp16 runs the
varlen kernel; anything else (the CPU tests, fp32) runs SDPA segment by segment, which is what the
tests compare against a per-sequence reference.
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch
import torch.nn.functional as F

NAME = "peer_varlen"

_cache: dict = {"key": None}


def _segments(position_ids: torch.Tensor | None, valid: torch.Tensor | None, batch: int, length: int, device):
    """Cumulative starts of the packed segments over the valid tokens (row-major), and the longest.

    A segment starts at each row's first valid token and wherever the position id does not follow
    the previous one by 1 (a new sequence in a packed row), the rule transformers uses.
    """
    if valid is None:
        valid = torch.ones(batch, length, dtype=torch.bool, device=device)
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    # first valid token of every row
    first = valid & (valid.cumsum(-1) == 1)
    starts |= first
    if position_ids is not None:
        pos = position_ids.expand(batch, -1) if position_ids.shape[0] != batch else position_ids
        jump = torch.ones_like(starts)
        jump[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        starts |= jump & valid
    flat_valid = valid.reshape(-1)
    flat_starts = starts.reshape(-1)[flat_valid]
    total = int(flat_valid.sum())
    if total == flat_valid.numel():
        flat_valid = None  # no padding: the tokens are taken as they lie, without boolean indexing (a host sync each)
    idx = torch.nonzero(flat_starts).flatten()
    cu = torch.cat([idx, torch.tensor([total], device=device)]).to(torch.int32)
    lengths = cu[1:] - cu[:-1]
    return cu, int(lengths.max()) if lengths.numel() else 0, flat_valid


def _cached_segments(position_ids, attention_mask, batch, length, device):
    """The segments are the same in every layer of one forward: find them once (one host sync).
    The cache holds weak references to the tensors it was computed from and is used only while
    those very tensor objects come back."""
    c = _cache
    if (
        c["key"] is not None
        and c["key"][2:] == (batch, length)
        and _same(c["key"][0], position_ids)
        and _same(c["key"][1], attention_mask)
    ):
        return c["value"]
    valid = attention_mask.to(torch.bool) if attention_mask is not None else None
    value = _segments(position_ids, valid, batch, length, device)
    ref = lambda t: weakref.ref(t) if t is not None else None  # noqa: E731
    c["key"], c["value"] = (ref(position_ids), ref(attention_mask), batch, length), value
    return value


def _same(ref, tensor) -> bool:
    if ref is None or tensor is None:
        return ref is None and tensor is None
    return ref() is tensor


@functools.cache
def _kernel_accepts(name: str) -> bool:
    from torch.nn.attention import varlen

    return name in inspect.signature(varlen.varlen_attn).parameters


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
):
    """transformers' attention-function contract: query (B, Hq, T, D), key/value (B, Hkv, T, D);
    returns ((B, T, Hq, D), None). Causal within each packed segment."""
    if dropout:
        raise ValueError(f"{NAME}: attention dropout {dropout} is not supported (the benchmark's models use 0)")
    if sliding_window is not None or softcap is not None or kwargs.get("s_aux") is not None:
        raise ValueError(f"{NAME}: sliding window, softcap and attention sinks are not supported")
    batch, heads, length, dim = query.shape
    if key.shape[2] != length:
        raise ValueError(f"{NAME}: query length {length} != key length {key.shape[2]} (no KV cache support)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"{NAME}: expected a 2D padding mask or None, got shape {tuple(attention_mask.shape)}")
    cu, max_len, flat_valid = _cached_segments(kwargs.get("position_ids"), attention_mask, batch, length, query.device)

    def flat(t):  # (B, H, T, D) -> (valid tokens, H, D)
        t = t.transpose(1, 2).reshape(batch * length, t.shape[1], dim)
        return t if flat_valid is None else t[flat_valid]

    q, k, v = flat(query), flat(key), flat(value)
    groups = heads // k.shape[1]
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
        from torch.nn.attention.varlen import varlen_attn

        extra = {}
        if groups > 1:
            if _kernel_accepts("enable_gqa"):
                extra["enable_gqa"] = True
            else:  # torch 2.11's varlen_attn takes equal head counts
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=(-1, 0), **extra)
    else:
        bounds = cu.tolist()
        parts = []
        for s, e in zip(bounds[:-1], bounds[1:]):
            qs, ks, vs = (t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling, enable_gqa=groups > 1)
            parts.append(o.squeeze(0).transpose(0, 1))
        out = torch.cat(parts) if parts else q.new_zeros(0, heads, dim)
    if flat_valid is None:
        return out.reshape(batch, length, heads, dim), None
    full = out.new_zeros(batch * length, heads, dim)
    full[flat_valid] = out
    return full.view(batch, length, heads, dim), None


def register() -> None:
    """Register `peer_varlen` with transformers (attention and mask: the mask is flash-attn's, None
    or the 2D padding mask, so the packed row gets no dense mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
