"""megatron-core expert-bias routers with a padding mask: broadcast the mask over experts.

Upstream: megatron-core 0.16.1, ``megatron/core/transformer/moe/router.py``,
``TopKRouter._apply_expert_bias``. ``TopKRouter.routing`` flattens ``padding_mask`` to
``[num_tokens]`` and passes it on, and ``_apply_expert_bias`` computes
``routing_map & (~padding_mask)`` with ``routing_map [num_tokens, num_experts]``: in every
training forward of a router with ``moe_router_enable_expert_bias`` (DeepSeek-V3's sigmoid
router) and a padding mask this fails to broadcast (``Attempting to broadcast a dimension of
length N``). The wrapper gives the original a ``[num_tokens, 1]`` mask, so padding tokens are
left out of ``local_tokens_per_expert`` (the counts the bias update uses), as intended.

Remove when megatron-core unsqueezes the mask there (check: ``grep -n "~padding_mask"
router.py`` shows a broadcastable mask in ``_apply_expert_bias``).
"""

from __future__ import annotations


def install() -> bool:
    """Wrap ``TopKRouter._apply_expert_bias`` once (idempotent); True when newly wrapped."""
    from megatron.core.transformer.moe.router import TopKRouter

    original = TopKRouter._apply_expert_bias
    if getattr(original, "_verl_mp_patched", False):
        return False

    def apply_expert_bias(self, routing_map, padding_mask=None):
        if padding_mask is not None and padding_mask.dim() == routing_map.dim() - 1:
            padding_mask = padding_mask.unsqueeze(-1)
        return original(self, routing_map, padding_mask=padding_mask)

    apply_expert_bias._verl_mp_patched = True
    TopKRouter._apply_expert_bias = apply_expert_bias
    return True
