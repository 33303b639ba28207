"""Micro-batched forward/backward through megatron's pipeline schedules.

Contract with the loss function (the algorithm layer): ``loss_fn(output, micro_batch)``
returns ``(loss, metrics)`` where ``loss`` is already normalised by *global* counts
(tokens or sequences over all micro-batches and data-parallel ranks; see
``verl_mp.algo.agg_loss``). The engine therefore *sums* micro-batch and DP gradient
contributions (megatron's ``calculate_per_token_loss`` mode without its own token
division), so the result does not depend on how the batch was split.

Metrics follow the same rule: values are summed over micro-batches and DP ranks, except
keys ending in ``_max``/``_min`` (reduced by max/min). Every rank gets the reduced
values (broadcast from the last pipeline stage).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.distributed as dist

from verl_mp.engine.runtime import ParallelState, local_device, megatron_scope

LossFn = Callable[[torch.Tensor, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]
OnForward = Callable[[dict, torch.nn.Module], dict]


def finalize_grads_summed(model, num_tokens=None, **kwargs):
    """megatron's grad finalisation (DP reduce-scatter, tied-embedding sync), minus its
    division by the token count: our losses are normalised before backward."""
    from megatron.core.distributed import finalize_model_grads

    return finalize_model_grads(model, num_tokens=None, **kwargs)


def _forward_step(loss_fn: LossFn | None, on_forward, data_iterator, model):
    batch = next(data_iterator)
    extra = on_forward(batch, model) if on_forward is not None else {}
    input_ids = batch["input_ids"]
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    # packed_seq_params (THD, padding removed) is set by verl_mp.engine.batching when packing.
    output = model(input_ids, position_ids, None, packed_seq_params=batch.get("packed_seq_params"), **extra)
    if loss_fn is None:
        return output, _collect_output
    return output, partial(_loss_wrapper, loss_fn, batch)


def _collect_output(output, non_loss_data=False):
    # forward-only path: keep the tensor; megatron stores what we return as "reduced".
    return output.new_zeros(()), torch.zeros((), dtype=torch.int), {"output": output}


def _loss_wrapper(loss_fn: LossFn, batch: dict, output: torch.Tensor):
    loss, metrics = loss_fn(output, batch)
    # The token count is only used by megatron for its own normalisation, which
    # finalize_grads_summed disables; pass 1 so that nothing is divided by zero.
    return loss, torch.ones((), dtype=torch.int), {k: v.detach() for k, v in metrics.items()}


def forward_backward(
    chunks: list,
    micro_batches: Sequence[dict],
    loss_fn: LossFn | None,
    *,
    forward_only: bool,
    on_forward: OnForward | None = None,
) -> list[dict]:
    """Run all micro-batches through the pipeline; return per-micro-batch dicts (last stage).

    ``on_forward(micro_batch, model_chunk) -> dict`` runs on every stage right before each
    micro-batch's forward and returns extra keyword arguments for the model (the engine sets
    per-micro-batch router state and the MoE padding mask there).

    With PP > 1 and ``config.variable_seq_lengths`` off, every micro-batch must have the
    same ``input_ids`` shape ``[b, s]`` (stages then exchange activations of that fixed
    shape); with it on (the engine's default for PP > 1) shapes may differ.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    b, s = micro_batches[0]["input_ids"].shape
    config = chunks[0].config
    if config.pipeline_model_parallel_size > 1 and not config.variable_seq_lengths:
        for mb in micro_batches:
            if tuple(mb["input_ids"].shape) != (b, s):
                raise ValueError(f"micro-batch shapes differ: {tuple(mb['input_ids'].shape)} vs {(b, s)}")
    for chunk in chunks:
        chunk.config.finalize_model_grads_func = finalize_grads_summed
    iterators = [iter(micro_batches) for _ in chunks]
    with megatron_scope():
        return get_forward_backward_func()(
            forward_step_func=partial(_forward_step, loss_fn, on_forward),
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(micro_batches),
            seq_length=s,
            micro_batch_size=b,
            forward_only=forward_only,
        )


def reduce_metrics(per_micro_batch: list[dict], state: ParallelState) -> dict[str, float]:
    """Reduce loss-function metrics over micro-batches, DP ranks, and the PP group."""
    from megatron.core import parallel_state as mps

    # Padding micro-batches of MoE engines report no metrics: keys are the union, and a key
    # sums/reduces over the micro-batches that have it.
    keys = sorted({k for mb in per_micro_batch for k in mb})
    names = _broadcast_names(keys, state)
    values = {}
    for name in names:
        vals = [mb[name].float().reshape(()) for mb in per_micro_batch if name in mb]
        op, local = _reduce_op(name, vals)
        # On the rank's device: NCCL cannot reduce CPU tensors.
        t = torch.tensor([local], dtype=torch.float64, device=local_device())
        dist.all_reduce(t, op=op, group=mps.get_data_parallel_group(with_context_parallel=True))
        values[name] = t
    for name in names:
        dist.broadcast(values[name], src=mps.get_pipeline_model_parallel_last_rank(),
                       group=mps.get_pipeline_model_parallel_group())
    return {name: values[name].item() for name in names}


def _reduce_op(name: str, vals: list[torch.Tensor]):
    if name.endswith("_max"):
        return dist.ReduceOp.MAX, max(v.item() for v in vals) if vals else float("-inf")
    if name.endswith("_min"):
        return dist.ReduceOp.MIN, min(v.item() for v in vals) if vals else float("inf")
    return dist.ReduceOp.SUM, sum(v.item() for v in vals)


def _broadcast_names(keys: list[str], state: ParallelState) -> list[str]:
    from megatron.core import parallel_state as mps

    holder = [keys if state.is_last_stage else None]
    dist.broadcast_object_list(holder, src=mps.get_pipeline_model_parallel_last_rank(),
                               group=mps.get_pipeline_model_parallel_group())
    return holder[0]


def train_step(chunks, optimizer, scheduler, micro_batches, loss_fn: LossFn, state: ParallelState,
               on_forward: OnForward | None = None) -> dict:
    """One optimizer step over ``micro_batches``; returns reduced metrics incl. grad_norm, lr."""
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    outputs = forward_backward(chunks, micro_batches, loss_fn, forward_only=False, on_forward=on_forward)
    with megatron_scope():
        update_ok, grad_norm, _ = optimizer.step()
    if update_ok:
        scheduler.step(increment=1)
    metrics = reduce_metrics(outputs, state)
    metrics["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    metrics["lr"] = optimizer.param_groups[0]["lr"]
    metrics["update_skipped"] = float(not update_ok)
    return metrics
