"""megatron-core MoE routers without transformer-engine: define ``te_general_gemm``.

Upstream: megatron-core 0.16.1, ``megatron/core/transformer/moe/moe_utils.py``. It imports
``te_general_gemm`` only inside ``try: import transformer_engine ...``, yet
``RouterGatingLinearFunction.forward/backward`` test ``if te_general_gemm is not None`` in
every case, so without transformer-engine (CPU machines, GPUs without TE) every router
forward raises ``NameError: name 'te_general_gemm' is not defined``. Defining the name as
None selects the torch ``mm``/``addmm`` path the function already has; with TE installed
the name exists and nothing changes.

Remove when megatron-core sets ``te_general_gemm = None`` in that ``except ImportError``
branch (check with ``grep -n te_general_gemm moe_utils.py``).
"""

from __future__ import annotations


def install() -> bool:
    """Define the missing name if needed (idempotent); True when it was missing."""
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True
