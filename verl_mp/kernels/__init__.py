"""Fused Triton kernels, each with a launcher that checks its inputs, a pure-torch
reference and a switch between the two (`dispatch.select_impl`: ``impl=`` argument or
``VERL_MP_KERNELS=torch|triton|auto``).

- `gae.gae_triton`: GAE as one reverse scan (reference `verl_mp.algo.gae_scan_torch`).
- `group_adv.group_advantages_triton`: GRPO / Dr.GRPO / RLOO outcome advantages over
  ragged groups (reference `verl_mp.algo.group_outcome_torch`).
- `logprob_loss.vocab_parallel_log_probs`: log-probs and entropy from TP-sharded logits
  with a streaming forward and a fused backward (torch reference inside).
- `layers.rms_norm`, `layers.swiglu`: the decoder layer's RMSNorm and SwiGLU in one pass
  each way, saving less for backward (references `rms_norm_torch`, `swiglu_torch`).

Importing this package does not import triton; kernels compile on first use.
"""

from verl_mp.kernels.dispatch import ENV_VAR, select_impl
from verl_mp.kernels.gae import gae_triton
from verl_mp.kernels.group_adv import group_advantages_triton
from verl_mp.kernels.logprob_loss import combine_partial_stats, vocab_parallel_log_probs

__all__ = [
    "ENV_VAR",
    "combine_partial_stats",
    "gae_triton",
    "group_advantages_triton",
    "select_impl",
    "vocab_parallel_log_probs",
]
