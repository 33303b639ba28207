"""Advantage estimators against hand-computed values and independent float64 loops."""

import math
import statistics
import warnings

import pytest
import torch

from verl_mp.algo import ADVANTAGE_ESTIMATORS
from verl_mp.algo import utils as algo_utils
from verl_mp.algo.advantages import _SINGLETON_KEY

pytestmark = pytest.mark.unit
T = torch.tensor


def _gae_python(rewards, values, mask, gamma, lam):
    """Independent GAE: walk the real tokens of each row only (lists of floats)."""
    adv = [[0.0] * len(row) for row in rewards]
    for b, row in enumerate(rewards):
        real = [t for t, m in enumerate(mask[b]) if m]
        last, next_value = 0.0, 0.0
        for t in reversed(real):
            last = row[t] + gamma * next_value - values[b][t] + gamma * lam * last
            adv[b][t], next_value = last, values[b][t]
    return adv


def _returns_python(rewards, mask, gamma):
    return _gae_python(rewards, [[0.0] * len(r) for r in rewards], mask, gamma, 1.0)


def _whiten_python(x, mask):
    vals = [
        v for row, mrow in zip(x, mask, strict=True) for v, m in zip(row, mrow, strict=True) if m
    ]
    mean, var = statistics.fmean(vals), statistics.variance(vals)
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(row, mrow, strict=True)]
        for row, mrow in zip(x, mask, strict=True)
    ]


def test_gae_hand_computed():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 9.0, 1.0], [5.0, 5.0, 5.0]])
    values = T([[0.5, 0.5, 0.5], [0.5, 7.0, 0.5], [1.0, 1.0, 1.0]])
    mask = T([[1, 1, 1], [1, 0, 1], [0, 0, 0]])  # a gap, and an empty row
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](
        rewards, values, mask, 0.5, 0.5, whiten=False, impl="torch"
    )
    expected = T([[-0.28125, -0.125, 0.5], [-0.125, 0.0, 0.5], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, T([[0.21875, 0.375, 1.0], [0.375, 0.0, 1.0], [0.0, 0.0, 0.0]]))


def test_gae_random_matches_python_and_whitens():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    mask = torch.rand(4, 9, generator=g) > 0.3
    mask[1] = False
    raw = _gae_python(rewards.tolist(), values.tolist(), mask.tolist(), 0.9, 0.8)
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](
        rewards, values, mask, 0.9, 0.8, whiten=False, impl="torch"
    )
    torch.testing.assert_close(adv, T(raw), atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, (T(raw) + values) * mask, atol=1e-5, rtol=0)
    white, _ = ADVANTAGE_ESTIMATORS["gae"](rewards, values, mask, 0.9, 0.8, impl="torch")
    torch.testing.assert_close(white, T(_whiten_python(raw, mask.tolist())), atol=1e-5, rtol=0)


def _outcome_rewards():
    """7 samples, groups {0: 4 samples, 1: 2 equal, 2: singleton}; one empty response."""
    rewards = torch.zeros(7, 4)
    mask = torch.ones(7, 4, dtype=torch.bool)
    mask[1] = False  # empty response: score 0
    mask[0, 2:] = False
    for row, (t, r) in enumerate(
        [(1, 1.0), (3, 7.0), (3, 1.0), (3, 1.0), (3, 2.0), (3, 2.0), (3, 5.0)]
    ):
        rewards[row, t] = r
    ids = T([10, 10, 10, 10, 4, 4, 99])
    return rewards, mask, ids


def _expand(per_seq, mask):
    return T(per_seq)[:, None] * mask.float()


def test_grpo_hand_computed():
    rewards, mask, ids = _outcome_rewards()
    adv, ret = ADVANTAGE_ESTIMATORS["grpo"](rewards, mask, ids, impl="torch")
    # group 10 scores [1, 0, 1, 1]: mean 0.75, unbiased std 0.5
    s = 0.5 + 1e-6
    torch.testing.assert_close(
        adv, _expand([0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s, 0, 0, 0], mask)
    )
    assert ret is adv
    assert (adv[4:] == 0).all()  # equal rewards and the singleton give exactly 0


def test_dr_grpo_and_rloo_hand_computed():
    rewards, mask, ids = _outcome_rewards()
    adv, _ = ADVANTAGE_ESTIMATORS["grpo"](rewards, mask, ids, norm_by_std=False, impl="torch")
    torch.testing.assert_close(adv, _expand([0.25, -0.75, 0.25, 0.25, 0, 0, 0], mask))
    adv, _ = ADVANTAGE_ESTIMATORS["rloo"](rewards, mask, ids, impl="torch")
    # leave-one-out: 1 - 2/3, 0 - 1, ...
    torch.testing.assert_close(adv, _expand([1 / 3, -1.0, 1 / 3, 1 / 3, 0, 0, 0], mask))


def test_singleton_group_warns_once_and_no_nan():
    algo_utils._WARNED.discard(_SINGLETON_KEY)
    rewards, mask, ids = _outcome_rewards()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("grpo", "rloo", "grpo"):
            adv, _ = ADVANTAGE_ESTIMATORS[name](rewards, mask, ids, impl="torch")
            assert torch.isfinite(adv).all() and (adv[6] == 0).all()
    assert sum("single sample" in str(w.message) for w in caught) == 1


def test_all_equal_rewards_give_zero():
    rewards = torch.full((6, 5), 0.1)
    mask = torch.ones(6, 5)
    ids = T([0, 0, 0, 1, 1, 1])
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        adv, _ = ADVANTAGE_ESTIMATORS[name](rewards, mask, ids, impl="torch")
        assert (adv == 0).all(), name


def test_reinforce_plus_plus_hand_computed():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = T([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    adv, ret = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"](rewards, mask, 0.5, impl="torch")
    torch.testing.assert_close(ret, T([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    assert ret.tolist() == _returns_python(rewards.tolist(), mask.tolist(), 0.5)
    torch.testing.assert_close(adv, T(_whiten_python(ret.tolist(), mask.tolist())))


def test_reinforce_plus_plus_baseline():
    rewards, mask, ids = _outcome_rewards()
    adv, ret = ADVANTAGE_ESTIMATORS["reinforce_plus_plus_baseline"](
        rewards, mask, ids, impl="torch"
    )
    centred = _expand([0.25, -0.75, 0.25, 0.25, 0, 0, 0], mask)
    torch.testing.assert_close(adv, T(_whiten_python(centred.tolist(), mask.tolist())))
    assert ret is adv


def test_remax_hand_computed():
    rewards = T([[0.0, 1.0, 2.0], [4.0, 0.0, 0.0]])
    mask = T([[1, 1, 0], [0, 0, 0]])
    adv, ret = ADVANTAGE_ESTIMATORS["remax"](rewards, mask, T([0.5, 1.0]))
    torch.testing.assert_close(ret, T([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]))


def test_fp16_inputs_do_not_overflow():
    rewards = torch.zeros(4, 3, dtype=torch.float16)
    rewards[:, :2] = torch.tensor([[60000.0], [50000.0], [-60000.0], [0.0]], dtype=torch.float16)
    mask = torch.ones(4, 3, dtype=torch.float16)
    ids = T([0, 0, 0, 0])
    for name in ("grpo", "rloo"):
        adv, _ = ADVANTAGE_ESTIMATORS[name](rewards, mask, ids, impl="torch")
        assert adv.dtype == torch.float32 and torch.isfinite(adv).all()
    values = torch.full((4, 3), 30000.0, dtype=torch.float16)
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](rewards, values, mask, 1.0, 1.0, impl="torch")
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
