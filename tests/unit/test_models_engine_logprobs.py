"""The engine's log-prob op routes to the fused kernel by `VERL_MP_KERNELS` / ``impl=`` and
gives the torch reference's numbers (padded vocabulary, temperature, entropy, gradients)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.engine.logprobs import vocab_parallel_log_probs  # noqa: E402
from verl_mp.kernels import ENV_VAR, logprob_loss  # noqa: E402
from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAVE_TRITON = triton_available() and (DEVICE == "cuda" or interpreter_ready())
needs_triton = pytest.mark.skipif(
    not HAVE_TRITON, reason="needs CUDA, or TRITON_INTERPRET=1 before triton's import"
)
pytestmark = pytest.mark.unit
VOCAB, PADDED = 11, 16


def padded_logits(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, PADDED, generator=g)).to(dtype)
    logits[..., VOCAB:] = 1e4  # padded rows must not matter at all
    targets = torch.randint(0, VOCAB, (2, 5), generator=g)
    return logits.to(DEVICE), targets.to(DEVICE)


def run(logits, targets, impl):
    x = logits.clone().requires_grad_()
    lp, ent = vocab_parallel_log_probs(
        x, targets, vocab_size=VOCAB, temperature=0.7, with_entropy=True, impl=impl
    )
    coef = torch.linspace(-1, 1, lp.numel(), device=DEVICE).view_as(lp)
    ((lp * coef).sum() + 0.3 * ent.sum()).backward()
    return lp.detach(), ent.detach(), x.grad


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_torch_reference(dtype):
    logits, targets = padded_logits(dtype)
    lp, ent, grad = run(logits, targets, "triton")
    ref_lp, ref_ent, ref_grad = run(logits, targets, "torch")
    # both read the same logits and compute in fp32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert grad.dtype == dtype
    # fp32: summation order only. bf16: both round the gradient to bf16, compiled Triton to
    # nearest as torch does, Triton's CPU interpreter toward zero (up to 1 ulp apart)
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-2)
    torch.testing.assert_close(grad.float(), ref_grad.float(), **tol)
    assert (grad[..., VOCAB:] == 0).all() and (ref_grad[..., VOCAB:] == 0).all()


def test_selection_follows_env_and_argument(monkeypatch):
    calls = []
    fused = logprob_loss.vocab_parallel_log_probs

    def spy(*args, **kwargs):
        calls.append(kwargs["impl"])
        return fused(*args, **kwargs)

    monkeypatch.setattr(logprob_loss, "vocab_parallel_log_probs", spy)
    logits, targets = padded_logits(torch.float32)
    monkeypatch.delenv(ENV_VAR, raising=False)
    vocab_parallel_log_probs(logits, targets, vocab_size=VOCAB)
    assert calls == (["triton"] if DEVICE == "cuda" and triton_available() else [])  # auto
    calls.clear()
    monkeypatch.setenv(ENV_VAR, "torch")
    vocab_parallel_log_probs(logits, targets, vocab_size=VOCAB)
    assert calls == []
    if HAVE_TRITON:
        monkeypatch.setenv(ENV_VAR, "triton")
        vocab_parallel_log_probs(logits, targets, vocab_size=VOCAB)
        vocab_parallel_log_probs(logits, targets, vocab_size=VOCAB, impl="torch")  # argument wins
        assert calls == ["triton"]
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match=ENV_VAR):
        vocab_parallel_log_probs(logits, targets, vocab_size=VOCAB)
