"""Policy losses, aggregation, KL, critic and entropy against hand-computed values."""

import math

import pytest
import torch

from verl_mp.algo import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    entropy_bonus,
    entropy_from_logits,
    explained_variance,
    kl_loss,
    log_probs_from_logits,
    value_loss,
)

pytestmark = pytest.mark.unit
T = torch.tensor
CLIP = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean")


def _ppo_case():
    ratios = T([[1.1, 1.5, 0.5, 0.7, 5.0]])
    log_probs = torch.log(ratios).requires_grad_()
    return log_probs, torch.zeros(1, 5), T([[1.0, 1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 5)


def test_ppo_clip_higher_and_dual_clip():
    log_probs, old, adv, mask = _ppo_case()
    loss, metrics = POLICY_LOSSES["ppo"](log_probs, old, adv, mask, **CLIP)
    # token losses: -1.1 (in range), -1.28 (clip high), -0.5 (ratio < 1 - clip_low, A > 0:
    # not clipped), 0.8 (clip low, A < 0), 3 (dual clip of 5)
    torch.testing.assert_close(loss, T(0.92 / 5))
    loss.backward()
    torch.testing.assert_close(log_probs.grad, T([[-1.1, 0.0, -0.5, 0.0, 0.0]]) / 5)
    torch.testing.assert_close(metrics["clipfrac"], T(0.4))
    torch.testing.assert_close(metrics["clipfrac_lower"], T(0.2))
    torch.testing.assert_close(metrics["ratio_max"], T(5.0))
    torch.testing.assert_close(metrics["ratio_min"], T(0.5))
    torch.testing.assert_close(
        metrics["approx_kl"], -torch.log(T([1.1, 1.5, 0.5, 0.7, 5.0])).mean()
    )


def test_ppo_without_dual_clip():
    log_probs, old, adv, mask = _ppo_case()
    loss, metrics = POLICY_LOSSES["ppo"](
        log_probs, old, adv, mask, **{**CLIP, "clip_ratio_c": None}
    )
    torch.testing.assert_close(loss, T(2.92 / 5))
    loss.backward()
    torch.testing.assert_close(log_probs.grad, T([[-1.1, 0.0, -0.5, 0.0, 5.0]]) / 5)
    assert metrics["clipfrac_lower"] == 0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES["ppo"](log_probs, old, adv, mask, **{**CLIP, "clip_ratio_c": 0.5})


def test_ppo_empty_mask_is_zero_not_nan():
    log_probs, old, adv, _ = _ppo_case()
    loss, metrics = POLICY_LOSSES["ppo"](log_probs, old, adv, torch.zeros(1, 5), **CLIP)
    assert loss == 0 and all(torch.isfinite(v) for v in metrics.values())


def test_gspo_sequence_ratio():
    log_probs = T([[0.1, 0.3], [0.5, 9.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    mask = T([[1, 1], [1, 0]])
    args = {**CLIP, "loss_agg_mode": "seq-mean-token-mean"}
    loss, metrics = POLICY_LOSSES["gspo"](log_probs, old, torch.ones(2, 2), mask, **args)
    s0 = math.exp(0.2)  # exp(mean log-ratio of sequence 0), inside [0.8, 1.28]
    torch.testing.assert_close(loss, T((-s0 - 1.28) / 2))  # sequence 1: exp(0.5) clipped
    loss.backward()
    torch.testing.assert_close(log_probs.grad, T([[-s0 / 4, -s0 / 4], [0.0, 0.0]]))
    torch.testing.assert_close(metrics["clipfrac"], T(1 / 3))


def test_pg_loss():
    log_probs = T([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv, mask = T([[1.0, 2.0], [-1.0, 5.0]]), T([[1, 1], [1, 0]])
    loss, _ = POLICY_LOSSES["pg"](log_probs, log_probs.detach(), adv, mask, **CLIP)
    torch.testing.assert_close(loss, T((1.0 + 4.0 - 0.5) / 3))
    loss.backward()
    torch.testing.assert_close(log_probs.grad, T([[-1.0, -2.0], [1.0, 0.0]]) / 3)


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token-mean", {}, 7 / 3),
        ("token-mean", {"global_num_tokens": 14}, 0.5),
        ("token-sum", {}, 7.0),
        ("seq-mean-token-sum", {}, 3.5),
        ("seq-mean-token-sum", {"global_num_seqs": 7}, 1.0),
        ("seq-mean-token-mean", {}, 2.75),
        ("seq-mean-token-sum-norm", {}, 7 / 6),
        ("seq-mean-token-sum-norm", {"max_response_len": 10}, 7 / 20),
    ],
)
def test_agg_loss_hand_computed(mode, kwargs, expected):
    loss_mat = T([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0], [7.0, 7.0, 7.0]])
    mask = T([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # padding holds a NaN; last row empty
    torch.testing.assert_close(agg_loss(loss_mat, mask, mode, **kwargs), T(expected))


def test_agg_loss_errors():
    with pytest.raises(ValueError, match="valid modes"):
        agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "mean")
    with pytest.raises(ValueError, match="shape"):
        agg_loss(torch.zeros(2, 2), torch.ones(2, 3), "token-mean")


def test_kl_estimators_hand_computed():
    log_probs, ref = T([[math.log(0.5), 0.0]]), T([[math.log(0.25), -50.0]])
    d = math.log(2)
    torch.testing.assert_close(KL_ESTIMATORS["k1"](log_probs, ref)[0, 0], T(d))
    torch.testing.assert_close(KL_ESTIMATORS["k2"](log_probs, ref)[0, 0], T(0.5 * d * d))
    torch.testing.assert_close(KL_ESTIMATORS["abs"](ref, log_probs)[0, 0], T(d))
    k3 = KL_ESTIMATORS["low_var_kl"](log_probs, ref)
    torch.testing.assert_close(k3, T([[0.5 + d - 1.0, 10.0]]))  # second token clamped
    assert KL_ESTIMATORS["k3"](log_probs.half(), ref.half()).dtype == torch.float32


def test_kl_loss_and_penalty():
    log_probs, ref = T([[-1.0, -2.0]]), T([[-1.5, -1.0]])
    mask = T([[1, 1]])
    loss, metrics = kl_loss(log_probs, ref, mask, estimator="k1", loss_agg_mode="token-mean")
    torch.testing.assert_close(loss, T(-0.25))
    rewards, m = apply_kl_penalty(T([[0.0, 1.0]]), log_probs, ref, T([[1, 0]]), kl_coef=0.1)
    torch.testing.assert_close(rewards, T([[-0.05, 0.0]]))
    torch.testing.assert_close(m["kl"], T(0.5))


def test_kl_controllers():
    fixed = FixedKLController(0.2)
    fixed.update(5.0, 100)
    assert fixed.value == 0.2
    ctl = AdaptiveKLController(0.1, target_kl=1.0, horizon=10)
    ctl.update(1.5, 5)  # error clipped to +0.2 -> x1.1
    assert ctl.value == pytest.approx(0.11)
    ctl.update(0.5, 5)  # error clipped to -0.2 -> x0.9
    assert ctl.value == pytest.approx(0.099)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


def test_value_loss_clipping():
    values = T([[1.0, 2.0]], requires_grad=True)
    old, returns, mask = T([[0.5, 2.0]]), T([[2.0, 1.0]]), T([[1, 1]])
    loss, metrics = value_loss(
        values, old, returns, mask, clip_range_value=0.2, loss_agg_mode="token-mean"
    )
    torch.testing.assert_close(loss, T((0.5 * 1.69 + 0.5) / 2))
    loss.backward()
    torch.testing.assert_close(values.grad, T([[0.0, 0.5]]))
    torch.testing.assert_close(metrics["vf_clipfrac"], T(0.5))
    loss, _ = value_loss(
        values, old, returns, mask, clip_range_value=None, loss_agg_mode="token-mean"
    )
    torch.testing.assert_close(loss, T(0.5))


def test_explained_variance():
    returns, mask = T([[1.0, 2.0, 3.0, 4.0]]), T([[1, 1, 1, 1]])
    assert explained_variance(returns, returns, mask) == 1.0
    assert explained_variance(torch.zeros(1, 4), returns, mask) == 0.0
    assert explained_variance(torch.zeros(1, 4), torch.ones(1, 4), mask) == 0.0  # Var[R] = 0


def test_entropy_and_log_probs_from_logits():
    logits = T([[[0.0, math.log(3.0)], [0.0, 0.0]]]).to(torch.bfloat16)  # [1, 2, 2]
    ent = entropy_from_logits(logits, chunk_tokens=1)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, T([[h, math.log(2)]]), atol=1e-2, rtol=0)
    logp = log_probs_from_logits(logits, T([[1, 0]]), chunk_tokens=1)
    torch.testing.assert_close(logp, T([[math.log(0.75), math.log(0.5)]]), atol=1e-2, rtol=0)
    assert logp.dtype == torch.float32
    bonus = entropy_bonus(ent, T([[1, 0]]), loss_agg_mode="token-mean")
    torch.testing.assert_close(bonus, ent[0, 0])
