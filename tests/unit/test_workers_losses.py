"""The engine losses the trainer builds (`verl_mp.workers.losses`) against hand-computed values:
how the policy loss, entropy bonus and KL loss combine, the critic's clipped value loss, and
how mean metrics are scaled so that the engine can sum them over micro-batches and ranks.
Shown to fail with the entropy bonus added instead of subtracted, with the KL term left
out, and with mean metrics not scaled by local / global tokens.
"""

import math

import pytest
import torch

from verl_mp.config.schema import ActorConfig, CriticConfig
from verl_mp.workers.losses import actor_loss, critic_loss

pytestmark = pytest.mark.unit


def _mb():
    """One micro-batch of 2 rows x 3 positions, 4 real tokens; ratio 1 (log p = old log p)."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    logp = torch.full((2, 3), -1.0)
    return mask, logp, {"response_mask": mask, "old_log_probs": logp.clone(),
                        "advantages": torch.tensor([[1.0, 2.0, 9.0], [3.0, -2.0, 9.0]]),
                        "ref_log_probs": torch.full((2, 3), -1.5)}


def test_actor_loss_is_policy_loss_minus_entropy_plus_kl():
    mask, logp, mb = _mb()
    entropy = torch.tensor([[0.5, 1.5, 7.0], [1.0, 1.0, 7.0]])
    cfg = ActorConfig(entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="k3")
    # this micro-batch holds half of the mini-batch's 8 tokens (another holds the rest)
    loss, metrics = actor_loss(cfg, global_tokens=8.0, global_seqs=4.0, max_len=3)(
        {"log_probs": logp, "entropy": entropy}, mb)
    pg = -(1 + 2 + 3 - 2) / 8  # ratio 1: -sum(A) / global tokens
    ent = (0.5 + 1.5 + 1.0 + 1.0) / 8
    k3 = math.exp(-0.5) + 0.5 - 1  # r - log r - 1 with log r = ref - log p = -0.5
    kl = 4 * k3 / 8
    assert float(loss) == pytest.approx(pg - 0.1 * ent + 0.2 * kl, rel=1e-6)
    assert float(metrics["pg_loss"]) == pytest.approx(pg, rel=1e-6)
    assert float(metrics["entropy"]) == pytest.approx(ent, rel=1e-6)
    assert float(metrics["kl_loss"]) == pytest.approx(kl, rel=1e-6)
    assert float(metrics["kl_loss_coef_max"]) == float(metrics["kl_loss_coef_min"]) == pytest.approx(0.2)
    # token means are scaled by local / global tokens (4 / 8), so sums over the mini-batch are means;
    # max/min metrics are not scaled
    assert float(metrics["approx_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["ratio_max"]) == pytest.approx(1.0) and float(metrics["ratio_min"]) == pytest.approx(1.0)


def test_actor_loss_without_entropy_or_kl():
    mask, logp, mb = _mb()
    loss, metrics = actor_loss(ActorConfig(entropy_coeff=0.0), 4.0, 2.0, 3)({"log_probs": logp}, mb)
    assert float(loss) == pytest.approx(-(1 + 2 + 3 - 2) / 4, rel=1e-6)
    assert "entropy" not in metrics and "kl_loss" not in metrics


def test_mean_metrics_are_scaled_by_the_local_share_of_tokens():
    mask, logp, mb = _mb()
    mb["old_log_probs"] = logp + torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.5, 0.0]])  # ratio 0.61 where A < 0: clipped
    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2)
    _, local = actor_loss(cfg, 4.0, 2.0, 3)({"log_probs": logp}, mb)
    _, half = actor_loss(cfg, 8.0, 4.0, 3)({"log_probs": logp}, mb)
    assert float(local["clipfrac"]) == pytest.approx(1 / 4)
    assert float(half["clipfrac"]) == pytest.approx(1 / 8)  # summed with the other half's share
    assert float(half["ratio_min"]) == float(local["ratio_min"]) == pytest.approx(math.exp(-0.5), rel=1e-6)


def test_critic_loss_is_half_the_clipped_squared_error():
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    mb = {"response_mask": mask, "values": torch.tensor([[0.0, 0.0, 0.0]]),
          "returns": torch.tensor([[1.0, -2.0, 5.0]])}
    values = torch.tensor([[0.25, 1.0, 3.0]])  # token 2 moved 1.0 from its old value: clipped at 0.5
    loss, metrics = critic_loss(CriticConfig(cliprange_value=0.5), 2.0, 1.0, 3)({"values": values}, mb)
    # token 1: (0.25 - 1)^2 = 0.5625; token 2: max((1 + 2)^2, (0.5 + 2)^2) = 9
    assert float(loss) == pytest.approx(0.5 * (0.5625 + 9.0) / 2, rel=1e-6)
    assert float(metrics["vf_loss"]) == pytest.approx(float(loss))
    assert float(metrics["vf_clipfrac"]) == pytest.approx(0.0)  # the unclipped term was larger
    assert float(metrics["vpred_mean"]) == pytest.approx((0.25 + 1.0) / 2)
