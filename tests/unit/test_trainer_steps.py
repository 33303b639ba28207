"""The pure parts of a step against hand-computed and float64 values: packing a batch,
rewards with a KL penalty, the estimator wiring of the config, the log-prob gap check,
the layout conversions, and the global counts a mini-batch's loss is normalised by."""

import math

import pytest
import torch

from verl_mp.config.schema import AlgorithmConfig
from verl_mp.data.batch import PromptBatch
from verl_mp.data.rl_batch import attention_mask, to_positions
from verl_mp.rollout.types import RolloutOutput
from verl_mp.trainer import steps

pytestmark = pytest.mark.unit


def _rollout():
    """2 prompts x 2 samples; prompt-major order."""
    return RolloutOutput(prompt_ids=[[5, 6, 7], [8]], response_ids=[[1, 2], [3], [4, 4, 4], []],
                         response_logprobs=[[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], []], n=2,
                         finished=[True, True, False, True])


def _batch():
    prompts = PromptBatch(input_ids=[[5, 6, 7], [8]], prompts=["a", "b"], ground_truths=["g0", "g1"],
                          data_sources=["s0", "s1"], extra_infos=[None, None], indices=[0, 1])
    return steps.build_batch(prompts, _rollout(), pad_token_id=0)


def test_build_batch_packs_prompts_responses_groups_and_rollout_log_probs():
    b = _batch()
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2], [5, 6, 7, 3, 0], [8, 4, 4, 4, 0], [8, 0, 0, 0, 0]]
    assert b.responses.tolist() == [[1, 2, 0], [3, 0, 0], [4, 4, 4], [0, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert b.group_ids.tolist() == [0, 0, 1, 1] and b.ground_truths == ["g0", "g0", "g1", "g1"]
    assert b.prompt_lengths.tolist() == [3, 3, 1, 1] and b.response_lengths.tolist() == [2, 1, 3, 0]
    expected = torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-0.4, -0.5, -0.6], [0, 0, 0]])
    assert torch.allclose(b.rollout_log_probs, expected)
    assert attention_mask(b).tolist() == [[1] * 5, [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]]


def test_positions_round_trip_to_the_next_token_layout():
    b = _batch()
    per_token = torch.arange(1, 13, dtype=torch.float32).view(4, 3) * b.response_mask
    positions = to_positions(b, per_token)
    # response token j of row i is scored at position prompt_len + j - 1
    assert positions[0].tolist() == [0, 0, 1, 2, 0] and positions[2].tolist() == [7, 8, 9, 0, 0]
    assert torch.equal(b.gather_response(positions), per_token)


def test_rewards_without_and_with_the_kl_penalty():
    b = _batch()
    b.token_level_scores = torch.zeros(4, 3)
    b.token_level_scores[:, 0] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert steps.compute_rewards(b, AlgorithmConfig(), steps.make_kl_controller(AlgorithmConfig())) == {}
    assert torch.equal(b.token_level_rewards, b.token_level_scores)
    b.old_log_probs = torch.full((4, 3), -1.0) * b.response_mask
    b.ref_log_probs = torch.full((4, 3), -1.5) * b.response_mask
    algo = AlgorithmConfig(use_kl_in_reward=True, kl_penalty="k1")
    algo.kl_ctrl.kl_coef = 0.1
    m = steps.compute_rewards(b, algo, steps.make_kl_controller(algo))
    # k1 = log p - log p_ref = 0.5 on every real token; reward = score - 0.1 * 0.5 there
    expected = (b.token_level_scores - 0.05) * b.response_mask
    assert torch.allclose(b.token_level_rewards, expected)
    assert m["actor/reward_kl_penalty"] == pytest.approx(0.5 * 3 / 4)  # mean over rows of row means (empty row: 0)
    assert m["actor/reward_kl_coef"] == pytest.approx(0.1)


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_wiring_uses_the_norm_setting(norm_by_std):
    b = _batch()
    b.token_level_rewards = torch.zeros(4, 3)
    b.token_level_rewards[:, 0] = torch.tensor([1.0, 0.0, 3.0, 1.0])
    steps.compute_advantages(b, AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=norm_by_std))
    scores = torch.tensor([1.0, 0.0, 3.0, 0.0], dtype=torch.float64)  # row 3 is empty: its reward is masked
    mean = torch.tensor([0.5, 0.5, 1.5, 1.5], dtype=torch.float64)
    std = torch.tensor([math.sqrt(0.5)] * 2 + [math.sqrt(4.5)] * 2, dtype=torch.float64)  # unbiased
    want = (scores - mean) / ((std + 1e-6) if norm_by_std else 1.0)
    got = b.advantages.double()[:, 0]
    assert torch.allclose(got[:3], want[:3], atol=1e-6)  # row 3 has no tokens: 0
    assert torch.equal(b.advantages, b.advantages * b.response_mask)


def test_gae_wiring_passes_gamma_and_lambda():
    b = _batch()
    b.token_level_rewards = torch.zeros(4, 3)
    b.token_level_rewards[2, 2] = 1.0
    b.values = torch.zeros(4, 3)
    steps.compute_advantages(b, AlgorithmConfig(adv_estimator="gae", gamma=0.5, lam=0.5))
    # row 2: returns-to-go with values 0: delta = r; A_t = sum (gamma*lam)^k delta_{t+k}
    assert torch.allclose(b.returns[2], torch.tensor([0.0625, 0.25, 1.0]))


def test_an_estimator_input_the_step_did_not_compute_is_named():
    b = _batch()
    b.token_level_rewards = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="'gae' needs values"):
        steps.compute_advantages(b, AlgorithmConfig(adv_estimator="gae"))


def test_log_prob_gap_metric_and_fail_fast_threshold():
    b = _batch()
    b.old_log_probs = b.rollout_log_probs + 0.25 * b.response_mask
    m = steps.logprob_gap_metrics(b)
    real = b.response_mask > 0  # the probability gap, computed here in float64 from the same values
    p_diff = (b.rollout_log_probs.double().exp() - b.old_log_probs.double().exp()).abs()[real]
    assert m == {"rollout/logprob_diff_max": pytest.approx(0.25), "rollout/logprob_diff_mean": pytest.approx(0.25),
                 "rollout/prob_diff_max": pytest.approx(p_diff.max().item(), rel=1e-6),
                 "rollout/prob_diff_mean": pytest.approx(p_diff.mean().item(), rel=1e-6)}
    assert m["rollout/prob_diff_max"] > 0
    steps.check_logprob_gap(m, 0.3, step=4)
    with pytest.raises(RuntimeError, match="step 4: rollout/trainer log-prob gap 0.25 exceeds .*threshold=0.1"):
        steps.check_logprob_gap(m, 0.1, step=4)
    b.rollout_log_probs = None  # a step whose rollout returned no log-probs
    assert steps.logprob_gap_metrics(b) == {}
    steps.check_logprob_gap({}, 0.1, step=5)


def test_mini_batch_losses_are_normalised_by_the_mini_batch_counts():
    from verl_mp.workers.batch_io import train_epochs

    class Engine:  # records what train_epochs hands to the engine
        def __init__(self):
            self.seen = []

        def train_step(self, inputs, loss_fn):
            self.seen.append((inputs["input_ids"].shape[0], loss_fn))
            return {"loss": float(len(self.seen))}

    b = _batch()
    b.advantages = torch.zeros(4, 3)
    counts = []
    engine = Engine()
    m = train_epochs(engine, b, ["advantages"], epochs=2, mini_batch_size=2, prefix="actor",
                     make_loss=lambda g, s, t: counts.append((g, s, t)))
    assert [rows for rows, _ in engine.seen] == [2, 2, 2, 2]
    # mini-batch 0: rows 0-1 (2 + 1 tokens, 2 sequences); 1: rows 2-3 (3 tokens, 1 non-empty);
    # the response length is the batch's padded one
    assert counts == [(3.0, 2.0, 3), (3.0, 1.0, 3)] * 2
    assert m == {"actor/loss": pytest.approx((1 + 2 + 3 + 4) / 4)}


def test_the_rollout_returns_log_probs_only_on_the_steps_that_use_them():
    from dataclasses import replace

    from verl_mp.config.loader import load_config
    from verl_mp.trainer.loop import RLTrainer

    cfg = load_config("grpo", ["model.path=m", "rollout.logprob_gap_freq=3"])
    trainer = RLTrainer.__new__(RLTrainer)
    trainer.cfg = cfg
    assert [trainer._sampling(s).logprobs for s in range(1, 8)] == [True, False, True, False, False, True, False]
    trainer.cfg = replace(cfg, rollout=replace(cfg.rollout, logprob_gap_freq=0))
    assert not any(trainer._sampling(s).logprobs for s in range(1, 8))
    assert trainer._sampling(2).seed != trainer._sampling(3).seed
    # carry-over: a conversation cut in any step is trained later, with every step's log-probs
    mt = replace(cfg.rollout.multi_turn, enable=True, carry_over=True)
    trainer.cfg = replace(cfg, rollout=replace(cfg.rollout, logprob_gap_freq=0, multi_turn=mt))
    assert all(trainer._sampling(s).logprobs for s in range(1, 8))


def test_groups_without_signal_are_counted_and_a_flat_batch_warns(caplog):
    import logging

    b = _batch()
    b.token_level_scores = torch.zeros(4, 3)
    b.token_level_scores[0, 0] = 1.0  # group 0: 1 vs 0 (signal); group 1: 0 vs 0 (none)
    assert steps.signal_metrics(b, step=3) == {"training/groups_without_signal": 0.5}
    b.token_level_scores.zero_()
    with caplog.at_level(logging.WARNING):
        assert steps.signal_metrics(b, step=4) == {"training/groups_without_signal": 1.0}
    assert "step 4: every prompt's samples got the same reward" in caplog.text
