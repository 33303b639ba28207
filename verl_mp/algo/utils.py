"""Masked reductions shared by the estimators and losses, all in fp32.

Shapes: `x` and `mask` are `[B, T]` (or any equal shapes); `mask` is 1 on real response
tokens and 0 on padding (bool, int or float). Reductions over an empty mask return 0
rather than NaN.
"""

from __future__ import annotations

import logging
import warnings

import torch

logger = logging.getLogger(__name__)

_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Emit `message` as a `RuntimeWarning` (and a log line) the first time `key` is seen."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def has_warned(key: str) -> bool:
    """Whether `warn_once(key, ...)` has fired (lets callers skip a device sync)."""
    return key in _WARNED


def as_float_mask(mask: torch.Tensor) -> torch.Tensor:
    """Mask `[...]` of any dtype -> fp32 tensor of 0/1."""
    return (mask != 0).to(torch.float32)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over positions where `mask` is set, in fp32."""
    prod = x.float() * as_float_mask(mask)
    return prod.sum() if dim is None else prod.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked positions; 0 where the mask is empty."""
    count = as_float_mask(mask)
    count = count.sum() if dim is None else count.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked positions (scalar); 0 for fewer than two tokens."""
    m = as_float_mask(mask)
    count = m.sum()
    mean = masked_sum(x, m) / count.clamp(min=1.0)
    sq = (((x.float() - mean) ** 2) * m).sum()
    denom = count - 1.0 if unbiased else count
    return torch.where(count > 1, sq / denom.clamp(min=1.0), torch.zeros_like(sq))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked positions, zero elsewhere. `[B, T]` fp32."""
    m = as_float_mask(mask)
    mean = masked_sum(x, m) / m.sum().clamp(min=1.0)
    var = masked_var(x, m)
    return (x.float() - mean) * torch.rsqrt(var + eps) * m


def masked_max(x: torch.Tensor, mask: torch.Tensor, empty: float) -> torch.Tensor:
    """Max over masked positions (scalar); `empty` if there are none."""
    m = mask != 0
    filled = torch.where(m, x.float(), torch.full_like(x, float("-inf"), dtype=torch.float32))
    return torch.where(m.any(), filled.max(), torch.tensor(empty, device=x.device))


def masked_min(x: torch.Tensor, mask: torch.Tensor, empty: float) -> torch.Tensor:
    """Min over masked positions (scalar); `empty` if there are none."""
    return -masked_max(-x.float(), mask, -empty)
