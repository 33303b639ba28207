"""On a CUDA machine importing verl_mp and entering megatron_scope change nothing."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_untouched():
    before = (torch.cuda.current_device, torch.cuda.Stream, torch.cuda.get_rng_state)
    from verl_mp.patches import megatron_cpu

    import verl_mp.engine.runtime  # noqa: F401

    assert megatron_cpu.install() is False
    with megatron_cpu.megatron_scope():
        t = torch.zeros(1, device="cuda")
        assert t.is_cuda and t.type() == "torch.cuda.FloatTensor"
    assert (torch.cuda.current_device, torch.cuda.Stream, torch.cuda.get_rng_state) == before
