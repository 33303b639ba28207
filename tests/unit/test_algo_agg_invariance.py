"""The loss gradient does not depend on micro-batching or the number of DP ranks.

One batch is split over 2 simulated DP ranks, each into 1, 2 or 4 micro-batches that are
trimmed to their own longest response (as dynamic batching pads them). Every call gets the
global token/sequence counts; gradients are summed over micro-batches and ranks, as a
trainer's accumulation plus a SUM all-reduce would do. The result must equal the
single-call gradient of the whole batch.
"""

import pytest
import torch

from verl_mp.algo import AGG_MODES, POLICY_LOSSES, kl_loss, value_loss

pytestmark = pytest.mark.unit
B, T = 8, 7
CLIP = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)


def _batch():
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    data = {
        "old": torch.randn(B, T, generator=g) * 0.1 - 1.0,
        "adv": torch.randn(B, T, generator=g),
        "ref": torch.randn(B, T, generator=g) * 0.1 - 1.0,
        "returns": torch.randn(B, T, generator=g),
        "old_values": torch.randn(B, T, generator=g),
    }
    params = {
        "logp": data["old"] + 0.3 * torch.randn(B, T, generator=g),
        "values": torch.randn(B, T, generator=g),
    }
    return mask, data, params


def _loss(name, mode, params, data, mask, rows, counts):
    """Actor (policy + KL) + critic loss of one micro-batch `rows`, trimmed to its length."""
    width = max(int(mask[rows].sum(-1).max()), 1)
    cut = lambda x: x[rows, :width]  # noqa: E731
    kw = dict(loss_agg_mode=mode, **counts)
    logp = cut(params["logp"])
    loss, _ = POLICY_LOSSES[name](logp, cut(data["old"]), cut(data["adv"]), cut(mask), **CLIP, **kw)
    kl, _ = kl_loss(logp, cut(data["ref"]), cut(mask), estimator="k3", **kw)
    vf, _ = value_loss(
        cut(params["values"]),
        cut(data["old_values"]),
        cut(data["returns"]),
        cut(mask),
        clip_range_value=0.5,
        **kw,
    )
    return loss + 0.1 * kl + vf


def _grads(name, mode, splits, global_counts):
    mask, data, raw = _batch()
    params = {k: v.clone().requires_grad_() for k, v in raw.items()}
    counts = {}
    if global_counts:
        counts = {
            "global_num_tokens": mask.sum(),
            "global_num_seqs": (mask.sum(-1) > 0).sum(),
            "max_response_len": T,
        }
    total = torch.zeros(())
    for rows in splits:
        loss = _loss(name, mode, params, data, mask, rows, counts)
        loss.backward()
        total += loss.detach()
    return total, params["logp"].grad, params["values"].grad


def _split(num_ranks, num_micro):
    per_rank = torch.arange(B).chunk(num_ranks)
    return [mb for rank_rows in per_rank for mb in rank_rows.chunk(num_micro)]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", ["ppo", "gspo", "pg"])
def test_gradient_invariant_to_micro_batches_and_dp(name, mode):
    ref_loss, ref_logp, ref_values = _grads(name, mode, [torch.arange(B)], global_counts=False)
    for num_ranks, num_micro in [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]:
        loss, g_logp, g_values = _grads(
            name, mode, _split(num_ranks, num_micro), global_counts=True
        )
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(g_logp, ref_logp, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(g_values, ref_values, atol=1e-6, rtol=1e-5)


def test_local_counts_are_not_invariant():
    """Sanity check that the test above can fail: local normalisation changes the result."""
    _, ref, _ = _grads("ppo", "token-mean", [torch.arange(B)], global_counts=False)
    _, local, _ = _grads("ppo", "token-mean", _split(2, 2), global_counts=False)
    assert not torch.allclose(ref, local)
