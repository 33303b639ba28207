"""Train a tiny GPT for a few steps at one (TP, PP, DP) layout; write losses, gradient
norms and the full parameters before and after training.

Run under torchrun (see tests/dist/test_parallel_parity.py). Every layout starts from
the same weights (a megatron dist checkpoint written by the (1,1,1) run) and sees the
same global batch: DP ranks take disjoint halves, micro-batches split them further.
Every step updates at the full learning rate (no warm-up). Parameters are written as
full TP=1 tensors under their global names (``<out>.pt``), with the largest difference
between data-parallel replicas.
"""

import argparse
import json

import torch
import torch.distributed as dist

from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine import checkpoint, model, optimizer, runtime, schedule
from verl_mp.engine.layout import megatron_param_layout
from verl_mp.models.spec import GPTSpec

SPEC = GPTSpec(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
               ffn_hidden_size=128, vocab_size=128, max_position_embeddings=64)
GLOBAL_BATCH, SEQ, MICRO = 8, 16, 2


def lm_loss(global_num_tokens: int):
    """Token-mean next-token cross entropy over the global batch (vocab-parallel)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    def loss_fn(logits, batch):
        labels = batch["labels"]
        mask = batch["loss_mask"]
        ce = vocab_parallel_cross_entropy(logits.float().transpose(0, 1).contiguous(),
                                          labels.transpose(0, 1).contiguous()).transpose(0, 1)
        loss = (ce * mask).sum() / global_num_tokens
        return loss, {"loss": loss}

    return loss_fn


def global_batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, SPEC.vocab_size, (GLOBAL_BATCH, SEQ + 1), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (GLOBAL_BATCH,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).float()
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), mask


def full_params(chunks, state) -> dict[str, torch.Tensor]:
    """Every parameter of this rank as a full TP=1 tensor, keyed by its global name."""
    out = {}
    for info in megatron_param_layout(chunks, state):
        param = info.param.detach()
        if info.tp_dim is None:
            out[info.global_name] = param.clone()
            continue
        shards = [torch.empty_like(param) for _ in range(state.tp_size)]
        dist.all_gather(shards, param.contiguous(), group=state.tp_group)
        out[info.global_name] = info.merge_tp_shards(shards)
    return out


def whole_model(chunks, state) -> tuple[dict[str, torch.Tensor], float]:
    """All ranks' full parameters merged (on every rank), and the largest difference
    between two ranks' copies of one tensor (data-parallel replicas must be identical)."""
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, full_params(chunks, state))
    merged, replica_diff = {}, 0.0
    for part in parts:
        for name, tensor in part.items():
            if name in merged:
                replica_diff = max(replica_diff, float((merged[name] - tensor).abs().max()))
            merged[name] = tensor
    return merged, replica_diff


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--init-ckpt", required=True)
    p.add_argument("--save-init", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    torch.manual_seed(0)
    parallel = ParallelConfig(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp)
    state = runtime.initialize_parallel(parallel, seed=0)
    cfg = model.transformer_config(SPEC, parallel, "fp32")
    chunks = model.build_gpt_chunks(SPEC, cfg, state)
    if a.save_init:
        checkpoint.save_model(chunks, a.init_ckpt)
    checkpoint.load_model(chunks, a.init_ckpt)
    chunks = model.wrap_ddp(chunks, cfg)
    init, _ = whole_model(chunks, state)
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, clip_grad=1.0, lr_warmup_steps=0)
    opt, sched = optimizer.build_optimizer(chunks, optim, "fp32", total_steps=a.steps)

    per_rank = GLOBAL_BATCH // state.dp_size
    losses, grad_norms, lrs = [], [], []
    for step in range(a.steps):
        inputs, labels, mask = global_batch(step)
        sl = slice(state.dp_rank * per_rank, (state.dp_rank + 1) * per_rank)
        inputs, labels, mask = inputs[sl], labels[sl], mask[sl]
        mbs = [dict(input_ids=inputs[i:i + MICRO], labels=labels[i:i + MICRO],
                    loss_mask=mask[i:i + MICRO]) for i in range(0, per_rank, MICRO)]
        metrics = schedule.train_step(chunks, opt, sched, mbs, lm_loss(int(global_batch(step)[2].sum())), state)
        losses.append(metrics["loss"])
        grad_norms.append(metrics["grad_norm"])
        lrs.append(metrics["lr"])
    final, replica_diff = whole_model(chunks, state)
    if dist.get_rank() == 0:
        torch.save({"init": init, "final": final}, f"{a.out}.pt")
        with open(a.out, "w") as f:
            json.dump({"losses": losses, "grad_norms": grad_norms, "lrs": lrs, "dp": state.dp_size,
                       "replica_diff": replica_diff}, f)
    runtime.destroy_parallel()


if __name__ == "__main__":
    main()
