"""Vocab-parallel log-prob/entropy op with fused backward vs a naive log_softmax path.

Tolerances follow the arithmetic: log-probs and entropy in fp32 whatever the logits dtype;
gradients within fp32 rounding plus one bf16 rounding (`assert_grad_close`). Shown to catch
what the former ``atol=1e-2`` let through: dropping the entropy term from the torch
backward (``g -= b * ...`` removed) now also fails the fused PPO loss test, whose entropy
gradient (coefficient 0.01) is below 1e-3 everywhere.
"""

import os
import threading
from functools import partial

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.algo import POLICY_LOSSES, entropy_bonus  # noqa: E402
from verl_mp.kernels import combine_partial_stats, vocab_parallel_log_probs  # noqa: E402
from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402
from verl_mp.kernels.logprob_loss import (  # noqa: E402
    _backward_torch,
    _backward_triton,
    _partial_stats_torch,
    _partial_stats_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAVE_TRITON = triton_available() and (DEVICE == "cuda" or interpreter_ready())
NO_TRITON = "needs CUDA, or TRITON_INTERPRET=1 before triton's import (test_kernels_fresh_process)"
IMPLS = [
    "torch",
    pytest.param("triton", marks=pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)),
]
pytestmark = pytest.mark.unit
# Log-probs and entropy are computed in fp32 from the same (bf16 or fp32) logits as the
# fp64 reference: |logits| ~ 10 gives fp32 rounding ~1e-6 (measured <= 6.6e-7) for both dtypes.
LOGP_TOL = 1e-4
BF16_ULP = 2.0**-7
"""One bf16 ulp, relative. The gradient is computed in fp32 and rounded once to the logits
dtype: torch rounds to nearest (half an ulp, measured 0.0039 relative); the Triton
interpreter truncates fp32 -> bf16 casts (a full ulp, measured 0.0076)."""
PPO = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean")


def make_inputs(num_tokens, vocab, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(num_tokens, vocab, generator=g) * 3).to(dtype).to(DEVICE)
    labels = torch.randint(0, vocab, (num_tokens,), generator=g).to(DEVICE)
    labels[-1] = -100  # an ignore index on a padding token
    return logits, labels


def naive(logits, labels, vocab_size=None, temperature=1.0):
    """Independent reference: fp64 log_softmax over the first `vocab_size` columns / T.

    Labels outside [0, vocab_size) give -lse, as documented for the op.
    """
    z = logits[:, :vocab_size].double() / temperature
    log_p = torch.log_softmax(z, -1)
    ok = (labels >= 0) & (labels < z.shape[-1])
    logp = log_p.gather(-1, torch.where(ok, labels, 0)[:, None]).squeeze(-1)
    logp = torch.where(ok, logp, -torch.logsumexp(z, -1))
    return logp, -(log_p.exp() * log_p).sum(-1)


def assert_grad_close(got, want, scale=1.0):
    """dL/dlogits in the logits dtype vs the fp64 reference: fp32 rounding (measured <= 1.7e-7
    on entries up to 2), plus one rounding to bf16 for bf16 logits. ``scale``: 1/T growth."""
    rtol = BF16_ULP if got.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.double(), want, atol=1e-6 * scale, rtol=rtol)


def padded_inputs(num_tokens, vocab_size, padded_vocab, dtype, seed=0):
    """Logits `[N, padded_vocab]` whose padded columns would dominate if not masked."""
    logits, labels = make_inputs(num_tokens, padded_vocab, dtype, seed)
    logits[:, vocab_size:] = 1e4
    labels = labels % vocab_size
    labels[-1] = -100  # ignore index
    labels[-2] = vocab_size + 1  # a padded id: log_prob = -lse, no one-hot gradient
    return logits, labels


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
    torch.testing.assert_close(logp.double(), ref_logp, atol=LOGP_TOL, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=LOGP_TOL, rtol=0)
    assert x.grad.dtype == dtype
    assert_grad_close(x.grad, y.grad)
    assert (x.grad[[2]] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_ppo_loss_matches_unfused(impl):
    logits, labels = make_inputs(8, 700, torch.bfloat16, seed=1)
    labels[-1] = 0
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], device=DEVICE)
    g = torch.Generator().manual_seed(2)
    old = naive(logits, labels)[0].float().view(2, 4) + 0.2 * torch.randn(2, 4, generator=g).to(
        DEVICE
    )
    adv = torch.randn(2, 4, generator=g).to(DEVICE)

    def loss_of(logp, ent):
        loss, metrics = POLICY_LOSSES["ppo"](logp.view(2, 4), old, adv, mask, **PPO)
        return loss - 0.01 * entropy_bonus(
            ent.view(2, 4), mask, loss_agg_mode="token-mean"
        ), metrics

    x = logits.clone().requires_grad_()
    loss, metrics = loss_of(*vocab_parallel_log_probs(x, labels, compute_entropy=True, impl=impl))
    loss.backward()
    y = logits.double().requires_grad_()
    ref_loss, ref_metrics = loss_of(*naive(y, labels))
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)  # both fp32 inside the loss (measured 1.8e-7)
    # 97% of the entries are below 1e-3: an elementwise relative bound, not atol=1e-2
    assert_grad_close(x.grad, y.grad)
    assert metrics["clipfrac"] == ref_metrics["clipfrac"]


@pytest.mark.parametrize("impl", IMPLS)
def test_tp_shards_combine_to_full_vocab(impl):
    """Two vocab shards: partial stats combined + per-shard backward == full vocabulary."""
    logits, labels = make_inputs(5, 400, torch.float32, seed=3)
    shards, starts = (logits[:, :250].contiguous(), logits[:, 250:].contiguous()), (0, 250)
    stats = [
        _partial_stats_triton(s, labels, v0, True)
        if impl == "triton"
        else _partial_stats_torch(s, labels, v0, True, 2)
        for s, v0 in zip(shards, starts, strict=True)
    ]
    lse, target, ent = combine_partial_stats(
        *(torch.stack(parts) for parts in zip(*stats, strict=True))
    )
    ref_logp, ref_ent = naive(logits, labels)
    torch.testing.assert_close((target - lse).double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    a, b = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    grad = torch.cat(
        [
            _backward_torch(s, labels, v0, lse, ent, a, b, 2)
            for s, v0 in zip(shards, starts, strict=True)
        ],
        -1,
    )
    y = logits.double().requires_grad_()
    ref = naive(y, labels)
    ((ref[0] * a).sum() + (ref[1] * b).sum()).backward()
    torch.testing.assert_close(grad.double(), y.grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "vocab_size,padded,temperature",
    [(297, 300, 0.7), (4999, 5008, 1.6), (4999, 5008, 1.0), (300, 300, 0.5)],
)
def test_padded_vocab_and_temperature(impl, dtype, vocab_size, padded, temperature):
    """Masked padded ids and T != 1 against fp64 log_softmax(logits[:, :vocab_size] / T)."""
    logits, labels = padded_inputs(6, vocab_size, padded, dtype, seed=7)
    coef_logp = torch.tensor([0.5, -1.0, 0.0, 2.0, 1.0, 1.0], device=DEVICE)
    coef_ent = torch.tensor([0.1, 0.0, 0.0, -0.3, 0.2, 0.4], device=DEVICE)  # row 2: skipped
    x = logits.clone().requires_grad_()
    logp, ent = vocab_parallel_log_probs(
        x,
        labels,
        compute_entropy=True,
        vocab_size=vocab_size,
        temperature=temperature,
        impl=impl,
    )
    ((logp * coef_logp).sum() + (ent * coef_ent).sum()).backward()
    y = logits.double().requires_grad_()
    ref_logp, ref_ent = naive(y, labels, vocab_size, temperature)
    ((ref_logp * coef_logp).sum() + (ref_ent * coef_ent).sum()).backward()
    scale = max(1.0, 1.0 / temperature)  # |logits / T| grows as T shrinks
    torch.testing.assert_close(logp.double(), ref_logp, atol=LOGP_TOL * scale, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=LOGP_TOL * scale, rtol=0)
    assert x.grad.dtype == dtype
    assert_grad_close(x.grad, y.grad, scale)
    assert (x.grad[:, vocab_size:] == 0).all()  # exactly zero, also where labels[-2] points
    assert (x.grad[2] == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num_shards,vocab_size", [(2, 390), (4, 290)])  # 4: one all-pad shard
def test_padded_tp_shards_combine_to_unsharded(impl, num_shards, vocab_size):
    """Per-shard stats with padding and T combined == the unsharded op == fp64; same grads."""
    temperature, padded = 0.8, 400
    logits, labels = padded_inputs(5, vocab_size, padded, torch.float32, seed=8)
    width = padded // num_shards
    starts = [r * width for r in range(num_shards)]
    shards = [logits[:, v0 : v0 + width].contiguous() for v0 in starts]
    valid = [min(width, max(0, vocab_size - v0)) for v0 in starts]
    opts = [dict(vocab_valid=n, temperature=temperature) for n in valid]
    shard_args = list(zip(shards, starts, opts, strict=True))
    if impl == "triton":
        stats = [_partial_stats_triton(s, labels, v0, True, **o) for s, v0, o in shard_args]
    else:
        stats = [_partial_stats_torch(s, labels, v0, True, 2, **o) for s, v0, o in shard_args]
    lse, target, ent = combine_partial_stats(
        *(torch.stack(parts) for parts in zip(*stats, strict=True))
    )
    full_logp, full_ent = vocab_parallel_log_probs(
        logits,
        labels,
        compute_entropy=True,
        vocab_size=vocab_size,
        temperature=temperature,
        impl=impl,
    )
    torch.testing.assert_close(target - lse, full_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, full_ent, atol=1e-5, rtol=0)
    ref_logp, ref_ent = naive(logits, labels, vocab_size, temperature)
    torch.testing.assert_close((target - lse).double(), ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    a, b = torch.randn(5, device=DEVICE), torch.randn(5, device=DEVICE)
    backward = _backward_triton if impl == "triton" else partial(_backward_torch, chunk_tokens=2)
    grad = torch.cat(
        [backward(s, labels, v0, lse, ent, a, b, **o) for s, v0, o in shard_args], -1
    )
    y = logits.double().requires_grad_()
    ref = naive(y, labels, vocab_size, temperature)
    ((ref[0] * a).sum() + (ref[1] * b).sum()).backward()
    torch.testing.assert_close(grad.double(), y.grad, atol=1e-5, rtol=0)
    assert (grad[:, vocab_size:] == 0).all()


class FakeTPGroup:
    """Stands in for a process group of `size` ranks played by threads of this process
    (a real gloo pair would cost seconds of process start-up)."""

    def __init__(self, size):
        self.size, self.barrier, self.slots = size, threading.Barrier(size), [None] * size
        self.local = threading.local()

    def all_reduce(self, tensor, op=None, group=None):
        rank = group.local.rank
        group.slots[rank] = tensor.clone()
        group.barrier.wait()
        stacked = torch.stack(group.slots)
        result = stacked.max(0).values if op == torch.distributed.ReduceOp.MAX else stacked.sum(0)
        group.barrier.wait()
        tensor.copy_(result)


@pytest.mark.parametrize("vocab_size,temperature", [(None, 1.0), (390, 0.8)])
def test_tp_all_reduce_path(monkeypatch, vocab_size, temperature):
    """vocab_parallel_log_probs with tp_group: two ranks (threads) each hold half the vocab
    (the second one with padding when `vocab_size` < 400).

    Torch implementation only: the Triton CPU interpreter is not thread-safe; the kernels'
    shard statistics are covered by test_tp_shards_combine_to_full_vocab.
    """
    impl = "torch"
    group = FakeTPGroup(2)
    monkeypatch.setattr(torch.distributed, "all_reduce", group.all_reduce)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: group.local.rank)
    if vocab_size is None:
        logits, labels = make_inputs(4, 400, torch.float32, seed=4)
    else:
        logits, labels = padded_inputs(4, vocab_size, 400, torch.float32, seed=4)
    results, errors = [None, None], []

    def rank_main(rank):
        try:
            group.local.rank = rank
            shard = logits[:, rank * 200 : (rank + 1) * 200].contiguous().requires_grad_()
            logp, ent = vocab_parallel_log_probs(
                shard,
                labels,
                compute_entropy=True,
                tp_group=group,
                vocab_size=vocab_size,
                temperature=temperature,
                impl=impl,
            )
            (logp.sum() + 0.5 * ent.sum()).backward()
            results[rank] = (logp.detach(), ent.detach(), shard.grad)
        except Exception as err:  # surfaced in the main thread below
            errors.append(err)
            group.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    y = logits.double().requires_grad_()
    ref_logp, ref_ent = naive(y, labels, vocab_size, temperature)
    (ref_logp.sum() + 0.5 * ref_ent.sum()).backward()
    for logp, ent, _ in results:
        torch.testing.assert_close(logp.double(), ref_logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    grad = torch.cat([results[0][2], results[1][2]], -1)
    torch.testing.assert_close(grad.double(), y.grad, atol=1e-5, rtol=0)


def test_launcher_checks():
    logits, labels = make_inputs(4, 50, torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        vocab_parallel_log_probs(logits.t(), labels, impl="torch")
    with pytest.raises(ValueError, match="dtype"):
        vocab_parallel_log_probs(logits, labels.int(), impl="torch")
    with pytest.raises(ValueError, match="shape"):
        vocab_parallel_log_probs(logits, labels[:2].contiguous(), impl="torch")
    with pytest.raises(ValueError, match="temperature"):
        vocab_parallel_log_probs(logits, labels, temperature=0.0, impl="torch")
    with pytest.raises(ValueError, match="vocab_size"):
        vocab_parallel_log_probs(logits, labels, vocab_size=0, impl="torch")


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
    torch.testing.assert_close(logp.double(), ref_logp, atol=LOGP_TOL, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=LOGP_TOL, rtol=0)
    assert_grad_close(x.grad, y.grad)
