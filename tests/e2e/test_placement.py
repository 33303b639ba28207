"""Split placement and the reward model through the real CLI on CPU (PPO, 2 steps).

A Ray run puts the critic (TP=1) and the reward model on one pool of their own next to
the actor group (Megatron TP=2 + vLLM TP=2): roles on one pool share its rank, so three Ray
workers, two torch worlds; it stops after step 1 and resumes for step 2. A torchrun run of the same PPO config hosts every
role on the two actor ranks (critic at TP=2, reward model scoring on both ranks). Same
seeds and fp32: both must compute the same rewards, values and losses.
"""

import math

import pytest
from omegaconf import OmegaConf

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, resumed_from, run_cli, run_log, steps_logged

pytestmark = pytest.mark.e2e

RM_COEF = 10.0


def _steps(out_dir):
    rows = {}
    for r in read_jsonl(str(out_dir / "metrics.jsonl")):
        assert r["step"] not in rows, f"step {r['step']} logged twice in {out_dir}"
        rows[r["step"]] = r
    return rows


def _save_tiny_reward_model(out_dir):
    """A random Qwen2 sequence classifier (num_labels=1) with the tiny tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from verl_mp.demo.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    return str(_save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "model"))


def _common(inputs, out, launcher, rm_path):
    return [*base_overrides(inputs, out, launcher), "actor.megatron.tensor_model_parallel_size=2",
            "rollout.tensor_model_parallel_size=2", "reward_model.enable=true", f"reward_model.path={rm_path}",
            f"reward_model.coef={RM_COEF}", "reward_model.micro_batch_size=4"]


@pytest.fixture(scope="module")
def split_run(tiny_run_inputs, reward_model_path, tmp_path_factory):
    """Ray: critic (TP=1) and reward model on one pool of their own (one worker hosts both);
    stopped after step 1 and resumed from its checkpoint for step 2."""
    out = tmp_path_factory.mktemp("split") / "run"
    args = ["--config-name", "ppo_split", *_common(tiny_run_inputs, out, "ray", reward_model_path),
            "critic.megatron.tensor_model_parallel_size=1", "trainer.placement.pools.critic=[1]",
            "trainer.placement.roles.reward_model=critic"]
    run_cli(args + ["trainer.max_steps_this_run=1"])
    first = run_log(out, "driver.log")  # the driver runs the loop under Ray; the console is quiet
    run_cli(args)
    return out, first, run_log(out, "driver.log", start=len(first.encode()))  # each run's own lines


@pytest.fixture(scope="module")
def colocated_run(tiny_run_inputs, reward_model_path, tmp_path_factory):
    """torchrun: the same PPO run with every role on the two actor ranks, uninterrupted."""
    out = tmp_path_factory.mktemp("colocated") / "run"
    run_cli(["--config-name", "ppo", *_common(tiny_run_inputs, out, "torchrun", reward_model_path),
             "trainer.save_final=false"])
    return out


def test_split_critic_trains_checkpoints_and_resumes(split_run):
    out, first_log, resumed_log = split_run
    steps = _steps(out)
    assert set(steps) == {0, 1, 2}
    for key in ["critic/vf_loss", "critic/vf_clipfrac", "critic/explained_variance", "critic/grad_norm",
                "critic/values/mean", "timing/values_s", "timing/update_critic_s", "actor/pg_loss"]:
        for step in (1, 2):
            assert key in steps[step] and math.isfinite(steps[step][key]), (step, key)
    for step in (1, 2):
        assert steps[step]["rollout/logprob_diff_max"] < 1e-4
    # each run's own log: the first validated and trained step 1 from scratch, the second
    # resumed from its checkpoint and ran only step 2 (and the final validation)
    assert steps_logged(first_log) == [0, 1] and not resumed_from(first_log), first_log[-3000:]
    assert resumed_from(resumed_log) == {("global_step_1", 1)}, resumed_log[-3000:]
    assert steps_logged(resumed_log) == [2], resumed_log[-3000:]
    for step in (1, 2):  # each checkpoint holds the split critic next to the actor
        ckpt = out / "checkpoints" / f"global_step_{step}"
        assert (ckpt / "meta.json").exists() and (ckpt / "actor").is_dir() and (ckpt / "critic").is_dir()
    saved = OmegaConf.load(out / "config.yaml").trainer.placement
    assert saved.roles == {"critic": "critic", "reward_model": "critic"} and saved.pools.critic == [1]
    groups = OmegaConf.load(out / "plan.yaml").groups  # one group, one worker, hosts both roles
    assert sorted(groups) == ["actor_rollout_ref", "critic"] and groups.critic.roles == ["critic", "reward_model"]


def _check_reward_model_metrics(steps):
    for step in (1, 2):
        m = steps[step]
        for key in ("reward/model_score/mean", "reward/model_score/std", "reward/rule_score/mean"):
            assert key in m, (step, key)
        # combine=add: score = rule + coef x model, and that is what reached the batch
        expected = m["reward/rule_score/mean"] + RM_COEF * m["reward/model_score/mean"]
        assert math.isclose(m["reward/score/mean"], expected, rel_tol=1e-5, abs_tol=1e-5)
        assert math.isclose(m["critic/score/mean"], m["reward/score/mean"], rel_tol=1e-5, abs_tol=1e-5)
        assert m["reward/model_score/std"] > 0


def test_reward_model_scores_reach_the_batch(split_run, colocated_run):
    _check_reward_model_metrics(_steps(split_run[0]))
    _check_reward_model_metrics(_steps(colocated_run))


# Same seeds, same initial weights, fp32: placement (and the critic's TP=1 vs TP=2, and a
# resume between the steps) must not change what is computed.
SAME = ["reward/score/mean", "reward/model_score/mean", "reward/model_score/std", "critic/values/mean",
        "critic/vf_loss", "critic/explained_variance", "critic/grad_norm", "actor/pg_loss", "actor/approx_kl"]


def test_placement_does_not_change_the_numbers(split_run, colocated_run):
    split, colocated = _steps(split_run[0]), _steps(colocated_run)
    for step in (0, 2):
        assert math.isclose(split[step]["val/score/mean"], colocated[step]["val/score/mean"], rel_tol=1e-4, abs_tol=1e-5)
    assert split[0]["val/score/mean"] != 0.0
    for step in (1, 2):
        for key in SAME:
            assert math.isclose(split[step][key], colocated[step][key], rel_tol=1e-3, abs_tol=1e-5), \
                (step, key, split[step][key], colocated[step][key])
