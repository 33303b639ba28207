"""verl_mp.utils.memory reads the caching allocator's counters in one call: the readings must be
the ones torch's own functions give (memory_allocated, memory_reserved, max_memory_allocated)."""

import pytest
import torch

from verl_mp.utils import memory

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_one_read_gives_torchs_own_counters():
    held = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
    metrics: dict[str, float] = {}
    with memory.tracked("phase", metrics):
        temporary = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        del temporary
    counters = memory._allocator_bytes()
    assert counters == {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                        "peak": torch.cuda.max_memory_allocated()}
    gib = memory.GIB
    assert metrics["memory/phase/after_allocated_gib"] == torch.cuda.memory_allocated() / gib >= 3
    assert metrics["memory/phase/after_reserved_gib"] == torch.cuda.memory_reserved() / gib
    # the peak of the block: what was held plus the temporary, not the process's peak before it
    assert metrics["memory/phase/peak_allocated_gib"] == pytest.approx(metrics["memory/phase/before_allocated_gib"] + 1)
    assert 0 < metrics["memory/phase/after_free_gib"] < torch.cuda.mem_get_info()[1] / gib
    del held
