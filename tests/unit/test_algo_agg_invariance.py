"""The trainer's own losses (`verl_mp.workers.losses`) do not depend on micro-batching or
the number of DP ranks.

One batch is split over 2 simulated DP ranks, each into 1, 2 or 4 micro-batches that are
trimmed to their own longest response (as dynamic batching pads them). Every call gets the
mini-batch's global token/sequence counts, as `train_epochs` passes them; gradients and
metrics are summed over micro-batches and ranks (`_max`/`_min` metrics reduced by max/min),
as the engine's accumulation and `reduce_metrics` do. The result must equal one call on
the whole batch: the loss, the gradients of log-probs, entropy and values, and every metric.

Shown to fail on a broken implementation: with ``actor_loss`` normalising by the micro-batch's
own token count (``global_num_tokens=mask.sum()`` inside ``loss_fn``) the three token-mean
cases fail; with ``_scale_means`` not scaling (``v`` instead of ``v * local / global``) all 15
fail on the metrics (approx_kl, clipfrac, ... summed instead of averaged).
"""

import pytest
import torch

from verl_mp.algo import AGG_MODES
from verl_mp.config.schema import ActorConfig, CriticConfig
from verl_mp.workers.losses import actor_loss, critic_loss

pytestmark = pytest.mark.unit
B, T = 8, 7


def _batch():
    """``mb``: what the engine hands a loss ([B, T] here: positions are tokens); ``params``:
    the engine outputs the loss differentiates."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = torch.randn(B, T, generator=g) * 0.1 - 1.0
    mb = {
        "response_mask": mask,
        "old_log_probs": old,
        "advantages": torch.randn(B, T, generator=g),
        "ref_log_probs": torch.randn(B, T, generator=g) * 0.1 - 1.0,
        "returns": torch.randn(B, T, generator=g),
        "values": torch.randn(B, T, generator=g),  # the critic's old values
    }
    params = {
        "log_probs": old + 0.3 * torch.randn(B, T, generator=g),
        "entropy": torch.rand(B, T, generator=g) * 2,
        "new_values": torch.randn(B, T, generator=g),
    }
    return mb, params


def _configs(policy_loss: str, mode: str):
    actor = ActorConfig(policy_loss=policy_loss, loss_agg_mode=mode, clip_ratio_low=0.2, clip_ratio_high=0.28,
                        clip_ratio_c=3.0, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                        kl_loss_type="k3")
    return actor, CriticConfig(cliprange_value=0.5, loss_agg_mode=mode)


def _run(policy_loss, mode, splits, local_counts=False):
    """Sum of (actor + critic) losses over micro-batches ``splits``; returns the loss,
    the gradients and the reduced metrics."""
    mb_all, raw = _batch()
    params = {k: v.clone().requires_grad_() for k, v in raw.items()}
    actor_cfg, critic_cfg = _configs(policy_loss, mode)
    total, metrics = torch.zeros(()), {}
    for rows in splits:
        mask = mb_all["response_mask"][rows]
        width = max(int(mask.sum(-1).max()), 1)
        mb = {k: v[rows, :width] for k, v in mb_all.items()}
        out = {k: v[rows, :width] for k, v in params.items()}
        counts_of = mb["response_mask"] if local_counts else mb_all["response_mask"]
        counts = (float(counts_of.sum()), float((counts_of.sum(-1) > 0).sum()), T)
        a_loss, a_metrics = actor_loss(actor_cfg, *counts)({"log_probs": out["log_probs"],
                                                            "entropy": out["entropy"]}, mb)
        c_loss, c_metrics = critic_loss(critic_cfg, *counts)({"values": out["new_values"]}, mb)
        (a_loss + c_loss).backward()
        total += (a_loss + c_loss).detach()
        for k, v in {**a_metrics, **{f"critic/{k}": v for k, v in c_metrics.items()}}.items():
            v = float(v)
            if k.endswith("_max"):
                metrics[k] = max(metrics.get(k, v), v)
            elif k.endswith("_min"):
                metrics[k] = min(metrics.get(k, v), v)
            else:
                metrics[k] = metrics.get(k, 0.0) + v
    return total, {k: p.grad for k, p in params.items()}, metrics


def _split(num_ranks, num_micro):
    per_rank = torch.arange(B).chunk(num_ranks)
    return [mb for rank_rows in per_rank for mb in rank_rows.chunk(num_micro)]


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", ["ppo", "gspo", "pg"])
def test_trainer_losses_invariant_to_micro_batches_and_dp(name, mode):
    ref_loss, ref_grads, ref_metrics = _run(name, mode, [torch.arange(B)])
    assert all(g.abs().sum() > 0 for g in ref_grads.values())  # every input reaches the loss
    assert {"pg_loss", "entropy", "kl_loss", "critic/vf_loss"} <= set(ref_metrics)
    for num_ranks, num_micro in [(1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]:
        loss, grads, metrics = _run(name, mode, _split(num_ranks, num_micro))
        where = (num_ranks, num_micro)
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5, msg=lambda m, w=where: f"{w}: {m}")
        for key, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[key], atol=1e-6, rtol=1e-5,
                                       msg=lambda m, k=key, w=where: f"{w} {k}: {m}")
        assert metrics.keys() == ref_metrics.keys()
        for key, value in ref_metrics.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (where, key)


def test_local_counts_are_not_invariant():
    """The test above can fail: normalising by each micro-batch's own counts changes the result."""
    _, ref, _ = _run("ppo", "token-mean", [torch.arange(B)])
    _, local, _ = _run("ppo", "token-mean", _split(2, 2), local_counts=True)
    assert not torch.allclose(ref["log_probs"], local["log_probs"])
