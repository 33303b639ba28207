"""Rollout corrections (`verl_mp.algo.rollout_correction`) against a float64 reference
computed token by token in plain Python, and their use in the actor loss: the weights
multiply the per-token policy-gradient term and the loss stays invariant to micro-batching
and data-parallel splits."""

import math

import pytest
import torch

from verl_mp.algo import AGG_MODES, POLICY_LOSSES, ROLLOUT_IS, ROLLOUT_MASKS, rollout_correction
from verl_mp.config.schema import ActorConfig, RolloutCorrectionConfig
from verl_mp.workers.losses import actor_loss

pytestmark = pytest.mark.unit
B, T = 6, 9
LENGTHS = [9, 4, 0, 7, 1, 5]
TOL = dict(rel_tol=1e-6, abs_tol=1e-7)


def _inputs(scale=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
    rollout = -torch.rand(B, T, generator=g) * 2 * mask
    old = (rollout + scale * torch.randn(B, T, generator=g)) * mask
    return old, rollout, mask


def _rows(old, rollout):
    """Per-row lists of float64 log-ratios over real tokens."""
    return [[float(old[i, t]) - float(rollout[i, t]) for t in range(LENGTHS[i])] for i in range(B)]


def _close(a, b):
    return math.isclose(a, b, **TOL)


def test_token_is_matches_float64():
    old, rollout, mask = _inputs()
    weights, m = rollout_correction(old, rollout, mask, is_level="token", is_threshold=1.3)
    ratios = [math.exp(x) for row in _rows(old, rollout) for x in row]
    for i, row in enumerate(_rows(old, rollout)):
        for t in range(T):
            want = min(math.exp(row[t]), 1.3) if t < len(row) else 0.0
            assert _close(float(weights[i, t]), want), (i, t)
    assert _close(m["rollout_corr/ratio_mean"], sum(ratios) / len(ratios))
    assert _close(m["rollout_corr/ratio_max"], max(ratios))
    assert _close(m["rollout_corr/ratio_min"], min(ratios))
    assert _close(m["rollout_corr/is_truncated_frac"], sum(r > 1.3 for r in ratios) / len(ratios))
    kept = [min(r, 1.3) for r in ratios]
    assert _close(m["rollout_corr/is_weight_mean"], sum(kept) / len(kept))
    assert 0 < m["rollout_corr/is_truncated_frac"] < 1  # the case exercises both sides


def test_sequence_is_matches_float64():
    old, rollout, mask = _inputs(scale=0.15)
    weights, m = rollout_correction(old, rollout, mask, is_level="sequence", is_threshold=1.5)
    rows = _rows(old, rollout)
    seq = [math.exp(sum(row)) for row in rows if row]
    for i, row in enumerate(rows):
        want = min(math.exp(sum(row)), 1.5)
        for t in range(T):
            assert _close(float(weights[i, t]), want if t < len(row) else 0.0), (i, t)
    assert _close(m["rollout_corr/seq_ratio_mean"], sum(seq) / len(seq))
    assert _close(m["rollout_corr/seq_ratio_max"], max(seq))
    assert _close(m["rollout_corr/is_truncated_frac"], sum(s > 1.5 for s in seq) / len(seq))
    assert 0 < m["rollout_corr/is_truncated_frac"] < 1


def test_token_mask_matches_float64():
    old, rollout, mask = _inputs(scale=0.6)
    weights, m = rollout_correction(old, rollout, mask, mask_level="token", mask_low=0.6, mask_high=1.4)
    masked = total = 0
    for i, row in enumerate(_rows(old, rollout)):
        for t in range(T):
            keep = t < len(row) and 0.6 <= math.exp(row[t]) <= 1.4
            assert float(weights[i, t]) == float(keep), (i, t)
            masked += t < len(row) and not keep
            total += t < len(row)
    assert _close(m["rollout_corr/masked_token_frac"], masked / total)
    assert 0 < masked < total


def test_sequence_mask_uses_the_geometric_mean():
    old, rollout, mask = _inputs(scale=0.5, seed=3)
    weights, m = rollout_correction(old, rollout, mask, mask_level="sequence", mask_low=0.8, mask_high=1.25)
    rows = _rows(old, rollout)
    dropped = 0
    for i, row in enumerate(rows):
        keep = bool(row) and 0.8 <= math.exp(sum(row) / len(row)) <= 1.25
        dropped += bool(row) and not keep
        for t in range(T):
            assert float(weights[i, t]) == float(keep and t < len(row)), (i, t)
    assert _close(m["rollout_corr/masked_seq_frac"], dropped / sum(1 for r in rows if r))
    assert 0 < dropped < 5


def test_is_and_mask_compose_by_product():
    old, rollout, mask = _inputs(scale=0.6)
    both, m = rollout_correction(old, rollout, mask, is_level="token", is_threshold=1.2, mask_level="token",
                                 mask_low=0.6, mask_high=1.4)
    is_w, _ = ROLLOUT_IS["token"](old - rollout, mask, threshold=1.2)
    keep, _ = ROLLOUT_MASKS["token"](old - rollout, mask, low=0.6, high=1.4)
    assert torch.equal(both, is_w * keep * mask)
    real = mask > 0
    assert _close(m["rollout_corr/weight_mean"], float(both[real].double().mean()))


def test_no_mismatch_gives_unit_weights_and_none_is_identity():
    _, rollout, mask = _inputs()
    weights, m = rollout_correction(rollout, rollout, mask, is_level="sequence", mask_level="token")
    assert torch.equal(weights, mask)
    assert m["rollout_corr/ratio_max"] == 1.0 and m["rollout_corr/masked_token_frac"] == 0.0
    old, rollout, mask = _inputs()
    weights, m = rollout_correction(old, rollout, mask)
    assert torch.equal(weights, mask) and "rollout_corr/ratio_mean" in m


def test_empty_batch_and_bad_shapes():
    zeros = torch.zeros(2, 3)
    weights, m = rollout_correction(zeros, zeros, zeros, is_level="token", mask_level="sequence")
    assert torch.equal(weights, zeros) and m["rollout_corr/ratio_mean"] == 1.0
    with pytest.raises(ValueError, match="must match"):
        rollout_correction(zeros, torch.zeros(2, 4), zeros)
    with pytest.raises(ValueError, match="valid names: sequence, token"):
        rollout_correction(zeros, zeros, zeros, is_level="tokens")


def test_config_refuses_bad_bands():
    with pytest.raises(ValueError, match="rollout_correction.is_threshold"):
        RolloutCorrectionConfig(is_threshold=0.0)
    with pytest.raises(ValueError, match="mask_low"):
        RolloutCorrectionConfig(mask_low=2.0, mask_high=1.5)
    assert not RolloutCorrectionConfig().enabled and RolloutCorrectionConfig(is_level="token").enabled


@pytest.mark.parametrize("name", ["ppo", "gspo", "pg"])
def test_weights_multiply_the_per_token_pg_term(name):
    """d loss / d log_probs with weights w equals w times the unweighted per-token gradient."""
    old, rollout, mask = _inputs()
    g = torch.Generator().manual_seed(5)
    adv = torch.randn(B, T, generator=g)
    base = old + 0.1 * torch.randn(B, T, generator=g)
    weights, _ = rollout_correction(old, rollout, mask, is_level="token", is_threshold=1.5)
    kw = dict(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-sum")
    grads = []
    for w in (None, weights):
        lp = base.clone().requires_grad_()
        POLICY_LOSSES[name](lp, old, adv, mask, **kw, **({} if w is None else {"token_weights": w}))[0].backward()
        grads.append(lp.grad)
    # GSPO too: its sequence ratio is detached, so token t's loss depends only on its own log-prob.
    assert torch.allclose(grads[1], grads[0] * weights, atol=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_weighted_actor_loss_is_invariant_to_micro_batching_and_dp(mode):
    """The actor's engine loss with rollout weights: 2 DP ranks x 1/2/4 micro-batches (each
    trimmed to its own longest response) sum to the single-call gradient."""
    old, rollout, mask = _inputs()
    g = torch.Generator().manual_seed(7)
    adv = torch.randn(B, T, generator=g)
    base = old + 0.2 * torch.randn(B, T, generator=g)
    weights, _ = rollout_correction(old, rollout, mask, is_level="token", is_threshold=1.3, mask_level="token",
                                    mask_low=0.5, mask_high=1.6)
    cfg = ActorConfig(loss_agg_mode=mode, clip_ratio_high=0.28)
    counts = dict(global_tokens=float(mask.sum()), global_seqs=float((mask.sum(-1) > 0).sum()), max_len=T)

    def grad(splits):
        lp = base.clone().requires_grad_()
        for rows in splits:
            width = max(int(mask[rows].sum(-1).max()), 1)
            def cut(x, rows=rows, width=width):
                return x[rows, :width]
            mb = {"response_mask": cut(mask), "old_log_probs": cut(old), "advantages": cut(adv),
                  "rollout_weights": cut(weights)}
            loss, _ = actor_loss(cfg, **counts)({"log_probs": cut(lp)}, mb)
            loss.backward()
        return lp.grad

    whole = grad([torch.arange(B)])
    for ranks, micro in ((2, 1), (2, 2), (1, 4)):
        splits = [mb for rank in torch.arange(B).chunk(ranks) for mb in rank.chunk(micro)]
        assert torch.allclose(grad(splits), whole, atol=1e-6), (ranks, micro)
    unweighted = actor_loss(cfg, **counts)({"log_probs": base}, {"response_mask": mask, "old_log_probs": old,
                                                                  "advantages": adv})[0]
    weighted = actor_loss(cfg, **counts)({"log_probs": base}, {"response_mask": mask, "old_log_probs": old,
                                                                "advantages": adv, "rollout_weights": weights})[0]
    assert not torch.isclose(weighted, unweighted)  # the weights reached the loss
