"""megatron-core multi-latent attention without transformer-engine: clear ``HAVE_TE``.

Upstream: megatron-core 0.16.1, ``megatron/core/transformer/multi_latent_attention.py``. It
sets ``HAVE_TE = True`` once ``megatron.core.extensions.transformer_engine`` imports, and that
module imports without transformer-engine too (it puts a ``MagicMock`` in place of ``te``), so
``TELinear`` is a mock, not a class. ``MultiLatentAttention.__init__`` then evaluates
``HAVE_TE and isinstance(self.linear_proj, TELinear)`` and every MLA layer fails to build with
``TypeError: isinstance() arg 2 must be a type``. ``HAVE_TE`` gates nothing else in that
module (the other TE names are only compared with ``in [...]``, which a mock survives), so
setting it to False when transformer-engine is not importable selects the path the module
already has for that case; with TE installed nothing changes.

Remove when megatron-core derives ``HAVE_TE`` there from importing ``transformer_engine``
itself (check: ``python -c "from megatron.core.transformer import multi_latent_attention as
m; print(m.HAVE_TE)"`` prints False without TE).
"""

from __future__ import annotations


def install() -> bool:
    """Clear the flag if transformer-engine is missing (idempotent); True when it was wrong."""
    from megatron.core.transformer import multi_latent_attention

    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        wrong = multi_latent_attention.HAVE_TE
        multi_latent_attention.HAVE_TE = False
        return wrong
    return False
