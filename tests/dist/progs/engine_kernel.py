"""The engine's log-probs through the fused Triton kernel vs the torch path; writes JSON.

Used by tests/dist/test_engine_kernel_tp.py (CPU, gloo, TP=2, fp32, ``TRITON_INTERPRET=1``)
and tests/gpu/test_engine_kernel_gpu.py (one GPU, bf16, large vocabulary, ``--timing``).

1. The op (`verl_mp.engine.logprobs.vocab_parallel_log_probs`) of each implementation on a
   padded vocabulary at temperature != 1 against fp64 log_softmax: values and the gradient
   of a loss mixing log-probs and entropy.
2. One actor engine (lr=0, no clipping, no weight decay: a step leaves the weights as they
   are) computes log-probs and entropy and takes a train step with a policy-gradient +
   entropy loss, once per implementation (``VERL_MP_KERNELS``), then once more with torch
   (the run-to-run noise floor). Recorded: the largest differences over all ranks, the
   gradient norms, every rank's Triton kernel launches during each run
   (`verl_mp.kernels.dispatch.TRITON_LAUNCHES`: evidence of the path that ran), and with
   ``--timing`` the time and peak memory of one train step.
   ``VERL_MP_KERNELS`` switches every kernel the engine uses: the log-prob op and the
   decoder layers' RMSNorm and SwiGLU (`verl_mp.kernels.layers`).
3. With ``--fp32-reference``: the same weights in an fp32 engine, and each path's distance
   to it (in bf16 the two paths round differently inside every layer).
"""

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from verl_mp.config.optim import OptimConfig
from verl_mp.config.parallel import ParallelConfig
from verl_mp.engine.config import EngineConfig
from verl_mp.engine.engine import MegatronEngine
from verl_mp.engine.logprobs import vocab_parallel_log_probs
from verl_mp.engine.runtime import destroy_parallel, local_device
from verl_mp.cli.rank_verify import token_batch
from verl_mp.kernels import ENV_VAR
from verl_mp.kernels.dispatch import TRITON_LAUNCHES

from engine_checks import pg_loss  # this folder is on sys.path: the progs run as scripts

TEMPERATURE = 0.7


def pg_entropy_loss(batch):
    return pg_loss(batch, entropy_coef=0.1)


def max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=local_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def sum_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=local_device())
    dist.all_reduce(t)
    return float(t)


def op_errors(tp_rank: int, tp_size: int, device) -> dict:
    """Largest |error| of each implementation's log-probs, entropy and logits gradient."""
    g = torch.Generator().manual_seed(0)
    vocab, padded, num_tokens = 4001, 4002, 6  # 4002 = 2 x 2001: the last id is padding
    width = padded // tp_size
    full = torch.randn(num_tokens, padded, generator=g) * 3
    full[:, vocab:] = 1e4  # would dominate the softmax if not masked
    targets = torch.randint(0, vocab, (num_tokens,), generator=g)
    a, b = torch.randn(num_tokens, generator=g), torch.randn(num_tokens, generator=g)
    y = full[:, :vocab].double().requires_grad_()
    log_p = torch.log_softmax(y / TEMPERATURE, -1)
    ref_lp, ref_ent = log_p.gather(-1, targets[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)
    ((ref_lp * a).sum() + (ref_ent * b).sum()).backward()
    ref_grad = torch.cat([y.grad, torch.zeros(num_tokens, padded - vocab).double()], -1)
    cols = slice(tp_rank * width, (tp_rank + 1) * width)
    errors = {}
    for impl in ("torch", "triton"):
        x = full[:, cols].contiguous().to(device).requires_grad_()
        lp, ent = vocab_parallel_log_probs(x, targets.to(device), vocab_size=vocab, temperature=TEMPERATURE,
                                           with_entropy=True, impl=impl)
        ((lp * a.to(device)).sum() + (ent * b.to(device)).sum()).backward()
        errors[impl] = dict(log_prob=float((lp.double().cpu() - ref_lp).abs().max()),
                            entropy=float((ent.double().cpu() - ref_ent).abs().max()),
                            grad=float((x.grad.double().cpu() - ref_grad[:, cols]).abs().max()),
                            padded_grad_max=float(x.grad[:, max(0, vocab - tp_rank * width):].abs().max()
                                                  if (tp_rank + 1) * width > vocab else 0.0))
    return {impl: {k: max_over_ranks(v) for k, v in e.items()} for impl, e in errors.items()}


def timed_step(engine, batch):
    """(metrics, seconds, peak bytes above the memory held before the step) of one train step."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    metrics = engine.train_step(batch, pg_entropy_loss(batch), temperature=TEMPERATURE, with_entropy=True)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - before if cuda else 0
    return metrics, seconds, peak


def run(engine, batch, impl: str, timing: bool) -> dict:
    """Log-probs, entropy, the local gradient vector and metrics with ``VERL_MP_KERNELS=impl``."""
    os.environ[ENV_VAR] = impl
    launched_before = dict(TRITON_LAUNCHES)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    lp, ent = engine.compute_log_probs(ids, mask, temperature=TEMPERATURE, with_entropy=True)
    if timing:  # warm-up: Triton compiles, allocator caches fill
        engine.train_step(batch, pg_entropy_loss(batch), temperature=TEMPERATURE, with_entropy=True)
    metrics, seconds, peak = timed_step(engine, batch)
    named = [(n, p) for chunk in engine.chunks for n, p in chunk.named_parameters()]
    grads = torch.cat([p.main_grad.detach().float().flatten() for _, p in named])
    # the norms' weights: a tiny share of all parameters, compared on their own
    norm_grads = torch.cat([p.main_grad.detach().float().flatten() for n, p in named if "norm" in n])
    launched = {k: n - launched_before.get(k, 0) for k, n in TRITON_LAUNCHES.items() if n > launched_before.get(k, 0)}
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, launched)
    return dict(lp=lp.cpu(), ent=ent.cpu(), grads=grads, norm_grads=norm_grads, metrics=metrics, step_s=seconds,
                peak_bytes=peak, launches=every_rank)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over all ranks."""
    return (sum_over_ranks(float((a - b).double().square().sum()))
            / sum_over_ranks(float(b.double().square().sum()))) ** 0.5


def compare(a: dict, b: dict, valid: torch.Tensor) -> dict:
    diff = a["grads"] - b["grads"]
    return dict(
        norm_grad_rel_l2=rel_l2(a["norm_grads"], b["norm_grads"]),
        log_prob_diff=max_over_ranks(float((a["lp"] - b["lp"])[valid].abs().max())),
        entropy_diff=max_over_ranks(float((a["ent"] - b["ent"])[valid].abs().max())),
        grad_diff=max_over_ranks(float(diff.abs().max())),
        grad_rel_l2=rel_l2(a["grads"], b["grads"]),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--timing", action="store_true", help="warm up, then time one train step per impl")
    p.add_argument("--fp32-reference", action="store_true",
                   help="also run an fp32 engine on the same weights: each path's distance to it (vs_fp32)")
    a = p.parse_args()
    cfg = EngineConfig(model_path=a.model, role="actor", dtype=a.dtype, micro_batch_size=a.micro_batch,
                       parallel=ParallelConfig(tensor_model_parallel_size=a.tp), attention_backend="sdpa",
                       optim=OptimConfig(lr=0.0, weight_decay=0.0, clip_grad=0.0))
    engine = MegatronEngine(cfg)
    engine.load_hf()
    res = {"op_errors": op_errors(engine.state.tp_rank, engine.state.tp_size, local_device())}
    vocab = engine.spec.vocab_size
    ids, mask = token_batch(vocab, batch=a.batch, seq=a.seq)
    has_next = mask.bool() & mask.roll(-1, 1).bool()
    has_next[:, -1] = False
    adv = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))
    batch = dict(input_ids=ids, attention_mask=mask, response_mask=has_next.float(), advantages=adv)
    runs = {impl: run(engine, batch, impl, a.timing) for impl in ("torch", "triton")}
    repeat = run(engine, batch, "torch", timing=False)
    res.update(
        vocab_size=vocab,
        padded_vocab=engine.chunks[0].module.output_layer.weight.shape[0] * engine.state.tp_size,
        tokens=int(mask.sum()),
        triton_vs_torch=compare(runs["triton"], runs["torch"], has_next),
        torch_repeat=compare(repeat, runs["torch"], has_next),
        **{f"{impl}_{k}": r[k] for impl, r in runs.items() for k in ("metrics", "step_s", "peak_bytes", "launches")},
    )
    if a.fp32_reference:  # the same weights in an fp32 engine: how far each bf16 path is from it
        del engine
        ref_engine = MegatronEngine(replace(cfg, dtype="fp32"))
        ref_engine.load_hf()
        ref = run(ref_engine, batch, "torch", timing=False)
        res["vs_fp32"] = {impl: compare(r, ref, has_next) for impl, r in runs.items()}
    if dist.get_rank() == 0:
        Path(a.out).write_text(json.dumps(res))
    dist.barrier()
    destroy_parallel()  # a rank that exits with gloo's threads alive can abort ("terminate called ...")


if __name__ == "__main__":
    main()
