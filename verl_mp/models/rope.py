"""Rotary inverse frequencies for the supported HF rope types.

megatron's RotaryEmbedding only knows Llama-3.1 scaling with fixed constants (factor 8,
low/high 1/4, original length 8192); the engine replaces its ``inv_freq`` with the one
computed here from the checkpoint's own parameters, so every rope type listed in
`verl_mp.models.hf_config.SUPPORTED_ROPE_TYPES` matches HF exactly.
"""

from __future__ import annotations

import math

import torch

from verl_mp.models.spec import GPTSpec


def rope_inv_freq(spec: GPTSpec) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (fp32, CPU) for ``spec``'s rope type."""
    dim = spec.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (spec.rotary_base**exponents)
    rope_type = spec.effective_rope_type
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / spec.rope_scaling_factor
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, spec)
    raise ValueError(f"GPTSpec.rope_type={spec.rope_type!r} is not supported")


def _llama3_scaled(inv_freq: torch.Tensor, spec: GPTSpec) -> torch.Tensor:
    """Llama-3.1: keep high frequencies, divide low ones by the factor, blend in between."""
    factor = spec.rope_scaling_factor
    low, high = spec.rope_low_freq_factor, spec.rope_high_freq_factor
    context = spec.rope_original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = context / low, context / high
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)
