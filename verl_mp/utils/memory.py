"""Device memory per phase, for the step's metrics (GPU only; empty on CPU).

``memory/<phase>/<when>_{allocated,reserved,free}_gib``: what PyTorch's caching allocator
holds for tensors (allocated), what it holds in all (reserved: allocated plus cached
blocks), and what the device has free (other allocators included: vLLM's KV cache and
weights live outside PyTorch's caching allocator). The peak of the phase is
``memory/<phase>/peak_allocated_gib``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

GIB = 2**30


def snapshot(phase: str, when: str) -> dict[str, float]:
    if not torch.cuda.is_available():
        return {}
    free, _ = torch.cuda.mem_get_info()
    prefix = f"memory/{phase}/{when}"
    return {f"{prefix}_allocated_gib": torch.cuda.memory_allocated() / GIB,
            f"{prefix}_reserved_gib": torch.cuda.memory_reserved() / GIB,
            f"{prefix}_free_gib": free / GIB}


@contextmanager
def tracked(phase: str, metrics: dict[str, float]):
    """Record the memory before and after the block, and its peak allocation, in ``metrics``."""
    if not torch.cuda.is_available():
        yield
        return
    metrics.update(snapshot(phase, "before"))
    torch.cuda.reset_peak_memory_stats()
    yield
    metrics[f"memory/{phase}/peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    metrics.update(snapshot(phase, "after"))
