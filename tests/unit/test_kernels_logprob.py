"""Vocab-parallel log-prob/entropy op with fused backward vs a naive log_softmax path."""

import os

import pytest
import torch
import torch.multiprocessing as mp

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.algo import POLICY_LOSSES, entropy_bonus  # noqa: E402
from verl_mp.kernels import combine_partial_stats, vocab_parallel_log_probs  # noqa: E402
from verl_mp.kernels.dispatch import interpret_mode, triton_available  # noqa: E402
from verl_mp.kernels.logprob_loss import _backward_torch, _partial_stats_torch, _partial_stats_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAVE_TRITON = triton_available() and (DEVICE == "cuda" or interpret_mode())
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAVE_TRITON, reason="no triton"))]
pytestmark = pytest.mark.unit
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
PPO = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean")


def make_inputs(num_tokens, vocab, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(num_tokens, vocab, generator=g) * 3).to(dtype).to(DEVICE)
    labels = torch.randint(0, vocab, (num_tokens,), generator=g).to(DEVICE)
    labels[-1] = -100  # an ignore index on a padding token
    return logits, labels


def naive(logits, labels):
    """Independent reference: full fp64 log_softmax."""
    log_p = torch.log_softmax(logits.double(), -1)
    logp = log_p.gather(-1, labels.clamp(min=0)[:, None]).squeeze(-1)
    logp = torch.where(labels >= 0, logp, -torch.logsumexp(logits.double(), -1))
    return logp, -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [300, 5000])  # 5000: two BLOCK_V chunks in the kernel
def test_log_probs_entropy_and_grad(impl, dtype, vocab):
    logits, labels = make_inputs(6, vocab, dtype)
    coef_logp = torch.tensor([0.5, -1.0, 0.0, 2.0, 0.0, 1.0], device=DEVICE)  # 0: skipped rows
    coef_ent = torch.tensor([0.1, 0.0, 0.0, -0.3, 0.2, 0.0], device=DEVICE)
    x = logits.clone().requires_grad_()
    logp, ent = vocab_parallel_log_probs(x, labels, compute_entropy=True, impl=impl)
    ((logp * coef_logp).sum() + (ent * coef_ent).sum()).backward()
    y = logits.double().requires_grad_()
    ref_logp, ref_ent = naive(y, labels)
    ((ref_logp * coef_logp).sum() + (ref_ent * coef_ent).sum()).backward()
    tol = TOL[dtype] * (10 if dtype == torch.float32 else 1)  # |logits| ~ 10: relative 1e-6
    torch.testing.assert_close(logp.double(), ref_logp, atol=tol, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=tol, rtol=0)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), y.grad, atol=TOL[dtype], rtol=0)
    assert (x.grad[[2]] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_ppo_loss_matches_unfused(impl):
    logits, labels = make_inputs(8, 700, torch.bfloat16, seed=1)
    labels[-1] = 0
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], device=DEVICE)
    g = torch.Generator().manual_seed(2)
    old = naive(logits, labels)[0].float().view(2, 4) + 0.2 * torch.randn(2, 4, generator=g).to(DEVICE)
    adv = torch.randn(2, 4, generator=g).to(DEVICE)

    def loss_of(logp, ent):
        loss, metrics = POLICY_LOSSES["ppo"](logp.view(2, 4), old, adv, mask, **PPO)
        return loss - 0.01 * entropy_bonus(ent.view(2, 4), mask, loss_agg_mode="token-mean"), metrics

    x = logits.clone().requires_grad_()
    loss, metrics = loss_of(*vocab_parallel_log_probs(x, labels, compute_entropy=True, impl=impl))
    loss.backward()
    y = logits.double().requires_grad_()
    ref_loss, ref_metrics = loss_of(*naive(y, labels))
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-4)  # both fp32 inside the loss
    torch.testing.assert_close(x.grad.double(), y.grad, atol=1e-2, rtol=0)
    assert metrics["clipfrac"] == ref_metrics["clipfrac"]


@pytest.mark.parametrize("impl", IMPLS)
def test_tp_shards_combine_to_full_vocab(impl):
    """Two vocab shards: partial stats combined + per-shard backward == full vocabulary."""
    logits, labels = make_inputs(5, 400, torch.float32, seed=3)
    shards, starts = (logits[:, :250].contiguous(), logits[:, 250:].contiguous()), (0, 250)
    stats = [
        _partial_stats_triton(s, labels, v0, True) if impl == "triton" else _partial_stats_torch(s, labels, v0, True, 2)
        for s, v0 in zip(shards, starts)
    ]
    lse, target, ent = combine_partial_stats(*(torch.stack(parts) for parts in zip(*stats)))
    ref_logp, ref_ent = naive(logits, labels)
    torch.testing.assert_close((target - lse).double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    a, b = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    grad = torch.cat([_backward_torch(s, labels, v0, lse, ent, a, b, 2) for s, v0 in zip(shards, starts)], -1)
    y = logits.double().requires_grad_()
    ref = naive(y, labels)
    ((ref[0] * a).sum() + (ref[1] * b).sum()).backward()
    torch.testing.assert_close(grad.double(), y.grad, atol=1e-5, rtol=0)


def _tp_worker(rank, init_file, logits, labels, out):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    shard = logits[:, rank * 200 : (rank + 1) * 200].contiguous().requires_grad_()
    logp, ent = vocab_parallel_log_probs(shard, labels, compute_entropy=True, tp_group=torch.distributed.group.WORLD)
    (logp.sum() + 0.5 * ent.sum()).backward()
    out[rank] = torch.cat([logp[None], ent[None], shard.grad.t()], 0)
    torch.distributed.destroy_process_group()


def test_tp_two_gloo_ranks(tmp_path):
    logits, labels = make_inputs(4, 400, torch.float32, seed=4)
    logits, labels = logits.cpu(), labels.cpu()
    out = torch.zeros(2, 2 + 200, 4).share_memory_()
    # fork: the children reuse this process's imports (spawn would re-import torch: slow).
    mp.start_processes(_tp_worker, args=(str(tmp_path / "rdzv"), logits, labels, out), nprocs=2, start_method="fork")
    y = logits.double().requires_grad_()
    ref_logp, ref_ent = naive(y, labels)
    (ref_logp.sum() + 0.5 * ref_ent.sum()).backward()
    for rank in range(2):
        torch.testing.assert_close(out[rank, 0].double(), ref_logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(out[rank, 1].double(), ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([out[0, 2:], out[1, 2:]]).t().double(), y.grad, atol=1e-5, rtol=0)


def test_launcher_checks():
    logits, labels = make_inputs(4, 50, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        vocab_parallel_log_probs(logits.t(), labels, impl="torch")
    with pytest.raises(ValueError, match="dtype"):
        vocab_parallel_log_probs(logits, labels.int(), impl="torch")
    with pytest.raises(ValueError, match="shape"):
        vocab_parallel_log_probs(logits, labels[:2].contiguous(), impl="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_vocab_gpu():
    logits, labels = make_inputs(64, 151936, torch.bfloat16, seed=5)
    x = logits.clone().requires_grad_()
    logp, ent = vocab_parallel_log_probs(x, labels, compute_entropy=True, impl="triton")
    (logp.sum() + ent.sum()).backward()
    y = logits.double().requires_grad_()
    ref_logp, ref_ent = naive(y, labels)
    (ref_logp.sum() + ref_ent.sum()).backward()
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-4, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-4, rtol=0)
    torch.testing.assert_close(x.grad.double(), y.grad, atol=1e-2, rtol=0)
