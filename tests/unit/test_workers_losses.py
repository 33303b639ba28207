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


# --- clipping and aggregation through the trainer's own loss functions (float64 by hand) ---
# Inputs are fp32; the losses compute in fp32, so values are compared at rel 1e-6
# (a few fp32 roundings of numbers of order 1).


def _pg_mb(log_ratio, advantages, mask):
    log_ratio = torch.tensor(log_ratio, dtype=torch.float32)
    old = torch.full_like(log_ratio, -2.0)
    logp = (old + log_ratio).requires_grad_()
    mb = {"response_mask": torch.tensor(mask, dtype=torch.float32), "old_log_probs": old,
          "advantages": torch.tensor(advantages, dtype=torch.float32)}
    return logp, mb


def test_asymmetric_clip_uses_each_bound_on_its_side():
    """clip_ratio_low=0.1, clip_ratio_high=0.3 (DAPO's clip-higher), dual clip off.
    Token 0: A=+1, r=1.5 -> clipped at 1 + high = 1.3; token 1: A=-2, r=0.5 -> clipped at
    1 - low = 0.9; token 2: A=+1, r=1.2 inside [0.9, 1.3] -> unclipped; token 3: A=-1,
    r=0.95 inside -> unclipped. Shown to fail with the bounds swapped in `actor_loss`
    (``clip_low=cfg.clip_ratio_high``, ``clip_high=cfg.clip_ratio_low``: loss 0.0375, not 0.0625)."""
    r = [1.5, 0.5, 1.2, 0.95]
    logp, mb = _pg_mb([[math.log(x) for x in r]], [[1.0, -2.0, 1.0, -1.0]], [[1, 1, 1, 1]])
    cfg = ActorConfig(clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=None)
    loss, metrics = actor_loss(cfg, 4.0, 1.0, 4)({"log_probs": logp}, mb)
    per_token = [-1.0 * 1.3, 2.0 * 0.9, -1.0 * 1.2, 1.0 * 0.95]
    assert float(loss.detach()) == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert float(metrics["clipfrac"]) == pytest.approx(2 / 4)
    loss.backward()
    # clipped tokens carry no gradient; unclipped ones d(-A r)/d log p = -A r, over 4 tokens
    expected = torch.tensor([[0.0, 0.0, -1.0 * 1.2 / 4, 1.0 * 0.95 / 4]])
    assert torch.allclose(logp.grad, expected, rtol=1e-6, atol=1e-9), logp.grad


def test_symmetric_clip_would_differ():
    """The same tokens with clip_ratio_low = clip_ratio_high = 0.2 give another loss: the test
    above tells the two bounds apart."""
    r = [1.5, 0.5, 1.2, 0.95]
    logp, mb = _pg_mb([[math.log(x) for x in r]], [[1.0, -2.0, 1.0, -1.0]], [[1, 1, 1, 1]])
    loss, _ = actor_loss(ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None),
                         4.0, 1.0, 4)({"log_probs": logp}, mb)
    assert float(loss) == pytest.approx((-1.2 + 2.0 * 0.8 - 1.2 + 0.95) / 4, rel=1e-6)


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    """clip_ratio_c=3: token 0 (A=-1, r=5) would lose max(5, 1.2) = 5; the dual clip caps it at
    3 and takes its gradient away; token 1 (A=-1, r=2: loss 2 < 3) and token 2 (A=+1, r=5:
    clipped at 1.2, positive advantages are never dual-clipped) are untouched.
    Shown to fail with ``clip_ratio_c`` not forwarded by `actor_loss` (None: loss (5+2-1.2)/3)."""
    logp, mb = _pg_mb([[math.log(5.0), math.log(2.0), math.log(5.0)]], [[-1.0, -1.0, 1.0]], [[1, 1, 1]])
    cfg = ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    loss, metrics = actor_loss(cfg, 3.0, 1.0, 3)({"log_probs": logp}, mb)
    assert float(loss.detach()) == pytest.approx((3.0 + 2.0 - 1.2) / 3, rel=1e-6)
    assert float(metrics["clipfrac_lower"]) == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]), rtol=1e-6, atol=1e-9), logp.grad
    off, _ = actor_loss(ActorConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None),
                        3.0, 1.0, 3)({"log_probs": logp.detach()}, mb)
    assert float(off) == pytest.approx((5.0 + 2.0 - 1.2) / 3, rel=1e-6)


def test_value_clipping_where_the_clipped_term_wins():
    """cliprange_value=0.5, old values 0. Token 0: V=1.0, R=0.9: the unclipped error 0.01 is
    smaller than the clipped one (0.5 - 0.9)^2 = 0.16, which wins and carries no gradient to V
    (its V_clip is constant). Token 1: V=0.3 (inside the range), R=-1: (1.3)^2 = 1.69, both
    terms equal, gradient 2 x 0.5 x 1.3. Token 2: V=-2, R=1: plain (-3)^2 = 9 > clipped
    (-0.5 - 1)^2 = 2.25. Shown to fail with ``torch.minimum`` in `algo.value_loss` and with
    ``cliprange_value`` not forwarded by `critic_loss` (clip_range_value=None: token 0 gives 0.01)."""
    values = torch.tensor([[1.0, 0.3, -2.0]], requires_grad=True)
    mb = {"response_mask": torch.ones(1, 3), "values": torch.zeros(1, 3), "returns": torch.tensor([[0.9, -1.0, 1.0]])}
    loss, metrics = critic_loss(CriticConfig(cliprange_value=0.5), 3.0, 1.0, 3)({"values": values}, mb)
    assert float(loss.detach()) == pytest.approx(0.5 * (0.16 + 1.69 + 9.0) / 3, rel=1e-6)
    assert float(metrics["vf_clipfrac"]) == pytest.approx(1 / 3)
    loss.backward()
    expected = torch.tensor([[0.0, 1.3 / 3, -3.0 / 3]])  # d(0.5 (V - R)^2 / 3)/dV = (V - R) / 3
    assert torch.allclose(values.grad, expected, rtol=1e-6, atol=1e-9), values.grad


# One micro-batch of a bigger mini-batch: 2 rows of 3 and 1 real tokens (global: 10 tokens,
# 4 sequences, max response length 6), so that every aggregation mode gives another number.
AGG_MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
GLOBAL_TOKENS, GLOBAL_SEQS, MAX_LEN = 10.0, 4.0, 6


def _agg64(per_token, mode):
    """Float64 loop over rows: the aggregation by its definition (docs/algorithms.md)."""
    rows = [[x for x, m in zip(row, mask, strict=True) if m] for row, mask in zip(per_token, AGG_MASK, strict=True)]
    total = sum(sum(r) for r in rows)
    return {"token-mean": total / GLOBAL_TOKENS, "token-sum": total,
            "seq-mean-token-sum": total / GLOBAL_SEQS,
            "seq-mean-token-mean": sum(sum(r) / len(r) for r in rows) / GLOBAL_SEQS,
            "seq-mean-token-sum-norm": total / (GLOBAL_SEQS * MAX_LEN)}[mode]


MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_the_agg_modes_give_different_numbers_here():
    values = [_agg64([[1.0, 2.0, 4.0, 9.0], [8.0, 9.0, 9.0, 9.0]], mode) for mode in MODES]
    assert len({round(v, 9) for v in values}) == len(MODES), values


@pytest.mark.parametrize("mode", MODES)
def test_actor_loss_aggregates_every_term_with_the_configured_mode(mode):
    """Policy loss, entropy bonus and KL term each aggregated with ``actor.loss_agg_mode``
    over the global counts. Ratio 1, so the policy loss per token is -A. Shown to fail with
    ``loss_agg_mode`` not forwarded to the policy loss (or to the entropy, or to the KL) in
    `actor_loss` (4 of 5 modes)."""
    adv = [[1.0, 2.0, 4.0, 9.0], [8.0, 9.0, 9.0, 9.0]]
    ent = [[0.5, 1.0, 2.0, 7.0], [3.0, 7.0, 7.0, 7.0]]
    ref_minus_logp = [[-0.5, 0.25, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
    logp = torch.full((2, 4), -1.0)
    mb = {"response_mask": torch.tensor(AGG_MASK), "old_log_probs": logp.clone(), "advantages": torch.tensor(adv),
          "ref_log_probs": logp + torch.tensor(ref_minus_logp)}
    cfg = ActorConfig(loss_agg_mode=mode, entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="k3")
    loss, metrics = actor_loss(cfg, GLOBAL_TOKENS, GLOBAL_SEQS, MAX_LEN)(
        {"log_probs": logp, "entropy": torch.tensor(ent)}, mb)
    pg = _agg64([[-a for a in row] for row in adv], mode)
    entropy = _agg64(ent, mode)
    kl = _agg64([[math.exp(d) - d - 1 for d in row] for row in ref_minus_logp], mode)  # k3 with log r = ref - logp
    assert float(metrics["pg_loss"]) == pytest.approx(pg, rel=1e-6)
    assert float(metrics["entropy"]) == pytest.approx(entropy, rel=1e-6)
    assert float(metrics["kl_loss"]) == pytest.approx(kl, rel=1e-6)
    assert float(loss) == pytest.approx(pg - 0.1 * entropy + 0.2 * kl, rel=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_critic_loss_aggregates_with_the_configured_mode(mode):
    """Old values = values (the clip is inactive): 0.5 (V - R)^2 aggregated by the mode. Shown
    to fail with ``loss_agg_mode`` not forwarded by `critic_loss` (4 of 5 modes)."""
    values = [[0.5, -1.0, 2.0, 5.0], [1.5, 5.0, 5.0, 5.0]]
    returns = [[0.0, 0.0, 1.0, 0.0], [-0.5, 0.0, 0.0, 0.0]]
    mb = {"response_mask": torch.tensor(AGG_MASK), "values": torch.tensor(values), "returns": torch.tensor(returns)}
    loss, _ = critic_loss(CriticConfig(loss_agg_mode=mode), GLOBAL_TOKENS, GLOBAL_SEQS,
                          MAX_LEN)({"values": torch.tensor(values)}, mb)
    half_sq = [[0.5 * (v - r) ** 2 for v, r in zip(vr, rr, strict=True)] for vr, rr in zip(values, returns, strict=True)]
    assert float(loss) == pytest.approx(_agg64(half_sq, mode), rel=1e-6)


def test_without_old_log_probs_the_ratio_is_the_update_pass_own():
    """`actor.old_log_probs=auto` with one optimizer step: the micro-batch carries no old
    log-probs, the loss takes the pass's own (detached). Loss and gradient equal those with
    old log-probs computed by a separate pass of the same weights; the gap to the rollout's
    log-probs is measured here, as `logprob_gap_metrics` measures it in the driver."""
    from types import SimpleNamespace

    from verl_mp.trainer.steps import gap_from_update, logprob_gap_metrics

    mask, _, mb = _mb()
    logp = torch.tensor([[-1.0, -0.5, -3.0], [-2.0, -0.25, -3.0]], requires_grad=True)
    rollout = torch.tensor([[-1.1, -0.45, 0.0], [-2.0, -0.2, 0.0]])
    cfg = ActorConfig(use_kl_loss=True, kl_loss_coef=0.2)
    with_old = {**mb, "old_log_probs": logp.detach().clone()}
    without = {k: v for k, v in mb.items() if k != "old_log_probs"} | {"rollout_log_probs": rollout}
    grads = []
    for micro in (with_old, without):
        logp.grad = None
        loss, metrics = actor_loss(cfg, 4.0, 2.0, 3)({"log_probs": logp}, micro)
        loss.backward()
        grads.append((float(loss), logp.grad.clone(), metrics))
    assert grads[0][0] == grads[1][0] and torch.equal(grads[0][1], grads[1][1])
    assert float(grads[1][2]["ratio_max"]) == float(grads[1][2]["ratio_min"]) == 1.0
    # the gap: max over tokens, mean over the micro-batch's tokens (here all 4 of the mini-batch)
    update = gap_from_update({f"actor/{k}": float(v) for k, v in grads[1][2].items()})
    rows = SimpleNamespace(response_mask=mask, rollout_log_probs=rollout, old_log_probs=logp.detach(),
                           require=lambda *names: None)
    driver = logprob_gap_metrics(rows)
    assert update.keys() == driver.keys() and len(driver) == 4
    for key, value in driver.items():
        assert update[key] == pytest.approx(value, rel=1e-6), key
    assert "rollout_logprob_diff_max" not in grads[0][2]  # no rollout log-probs in the micro-batch: no gap
