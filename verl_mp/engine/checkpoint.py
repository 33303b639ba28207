"""megatron distributed checkpoints of an engine (layout-independent).

A checkpoint saved at one (TP, PP, EP, expert-TP) loads at any other: every tensor is stored
with its global shape (routed experts by their global index) and each rank reads only its
own slice. Exception: optimizer state does not move between EP = 1 and EP > 1
(`_check_optimizer_layout`); the model alone does. `save_model`/`load_model` handle the
model alone; `save_training_state`/`load_training_state` add the DistributedOptimizer
state (megatron's ``fully_reshardable`` format: per-parameter fp32 main weights and Adam
moments in model space, so it too loads at any TP/PP/DP), the LR scheduler and the
RNG states. RNG states are per rank (``rng/rank{r}.pt``) and are restored only when the
checkpoint was written with the same world size and layout (a warning says so otherwise).

Note: megatron's torch_dist writer starts a spawn-context multiprocessing helper, so a
script that saves must guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import json
import logging
import os
import random

import numpy as np
import torch
import torch.distributed as dist

from verl_mp.engine.runtime import ParallelState, megatron_scope

logger = logging.getLogger(__name__)

META_FILE = "verl_mp_engine.json"


def _unwrap(chunk):
    return getattr(chunk, "module", chunk)


def model_sharded_state_dict(chunks: list) -> dict:
    """One entry per virtual-pipeline chunk; ShardedTensor keys are global, so the
    same checkpoint serves any chunking."""
    return {f"chunk{i}": _unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def save_model(chunks: list, directory: str) -> None:
    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    with megatron_scope():
        dist_checkpointing.save(model_sharded_state_dict(chunks), directory)


def load_model(chunks: list, directory: str) -> None:
    """Load a model checkpoint into ``chunks`` in place (any TP/PP it was saved with)."""
    from megatron.core import dist_checkpointing

    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    with megatron_scope():
        loaded = dist_checkpointing.load(model_sharded_state_dict(chunks), directory)
    for i, chunk in enumerate(chunks):
        _unwrap(chunk).load_state_dict(loaded[f"chunk{i}"], strict=True)


# megatron 0.16's default "fully_sharded_model_space" relies on ShardedTensor.flattened_range,
# which its own validation now rejects; "fully_reshardable" also reshards over TP/PP/DP.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def ensure_optimizer_state(optimizer) -> None:
    """Allocate zero Adam state (step 0) where none exists yet, without touching parameters.

    megatron's DistributedOptimizer builds its loading state dict from the existing torch
    Adam state; a fresh optimizer (no step taken) has none and would fail.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state[p]:
                    inner.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p.data),
                                          exp_avg_sq=torch.zeros_like(p.data))


def _full_state(chunks, optimizer, scheduler, is_loading: bool) -> dict:
    model_sd = model_sharded_state_dict(chunks)
    state = {"model": model_sd}
    if optimizer is not None:
        if is_loading:
            ensure_optimizer_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                          metadata=dict(OPTIMIZER_METADATA))
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _layout(state: ParallelState) -> dict:
    return dict(world_size=dist.get_world_size(), tp=state.tp_size, pp=state.pp_size, dp=state.dp_size,
                vpp=state.vpp_size, ep=state.ep_size, etp=state.etp_size)


def save_training_state(chunks, optimizer, scheduler, state: ParallelState, directory: str,
                        extra: dict | None = None) -> None:
    """Model + optimizer + scheduler (+ ``extra`` JSON metadata) + per-rank RNG. Collective."""
    from megatron.core import dist_checkpointing

    os.makedirs(os.path.join(directory, "rng"), exist_ok=True)
    dist.barrier()
    with megatron_scope():
        dist_checkpointing.save(_full_state(chunks, optimizer, scheduler, is_loading=False), directory)
    torch.save(_rng_state(), os.path.join(directory, "rng", f"rank{dist.get_rank()}.pt"))
    if dist.get_rank() == 0:
        with open(os.path.join(directory, META_FILE), "w") as f:
            json.dump({"layout": _layout(state), **(extra or {})}, f, indent=2)
    dist.barrier()


def read_meta(directory: str) -> dict:
    """The JSON metadata `save_training_state` wrote (layout, role, ...)."""
    meta_file = os.path.join(directory, META_FILE)
    if not os.path.isfile(meta_file):
        raise FileNotFoundError(f"{meta_file} not found: {directory} is not an engine checkpoint "
                                f"written by save_checkpoint")
    with open(meta_file) as f:
        return json.load(f)


def load_training_state(chunks, optimizer, scheduler, state: ParallelState, directory: str) -> dict:
    """Load what `save_training_state` wrote (at any TP/PP); return its ``extra`` metadata."""
    from megatron.core import dist_checkpointing

    meta = read_meta(directory)
    if optimizer is not None:
        _check_optimizer_layout(directory, meta.get("layout") or {}, state)
    with megatron_scope():
        loaded = dist_checkpointing.load(_full_state(chunks, optimizer, scheduler, is_loading=True), directory)
        for i, chunk in enumerate(chunks):
            _unwrap(chunk).load_state_dict(loaded["model"][f"chunk{i}"], strict=True)
        if optimizer is not None:
            _load_optimizer(optimizer, loaded["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(loaded["scheduler"])
    _maybe_restore_rng(directory, meta.get("layout"), state)
    return {k: v for k, v in meta.items() if k != "layout"}


def _check_optimizer_layout(directory: str, saved: dict, state: ParallelState) -> None:
    """megatron keeps routed experts in an optimizer of their own only at EP > 1 (a chained
    optimizer with other checkpoint keys), so optimizer state moves between EP > 1 layouts
    but not between EP = 1 and EP > 1."""
    saved_ep = saved.get("ep", 1)
    if (saved_ep > 1) != (state.ep_size > 1):
        raise ValueError(
            f"{directory} was saved at expert_model_parallel_size={saved_ep}; its optimizer state cannot "
            f"load at expert_model_parallel_size={state.ep_size} (megatron-core keeps experts in a separate "
            f"optimizer only when EP > 1): resume with EP {'> 1' if saved_ep > 1 else '= 1'}, or export the "
            f"weights (verl-mp convert megatron-to-hf) and start a new optimizer"
        )


def _load_optimizer(optimizer, state_dict: dict) -> None:
    """``optimizer.load_state_dict`` with a workaround for megatron-core 0.16 + torch Adam.

    With torch's Adam (no apex/TE), ``DistributedOptimizer.load_state_dict`` first gives every
    parameter a ``step`` state, then ``load_parameter_state_from_fully_reshardable`` copies
    *every* state key from the checkpoint, which never contains ``step`` (KeyError). So the
    parameter state is loaded in a second call with ``step`` removed for its duration.
    ``load_state_dict`` also gives every parameter the *same* ``step`` tensor, which torch
    Adam then increments once per parameter per step; each parameter gets its own copy.
    A mixture-of-experts model at EP > 1 has a chained optimizer (dense and expert
    parameters, ``state_dict`` keyed by their index); each link is handled the same way.
    Remove when megatron-core skips ``step`` in ``_set_main_param_and_optimizer_states``
    and clones it per parameter.
    """
    opts = getattr(optimizer, "chained_optimizers", [optimizer])
    links = [state_dict] if len(opts) == 1 else [state_dict[k] for k in sorted(state_dict)]
    param_states = [link.pop("param_state", None) for link in links]
    optimizer.load_state_dict(state_dict)
    for opt, param_state in zip(opts, param_states, strict=True):
        if param_state is None:
            continue
        inner = opt.optimizer.state
        steps = {p: st.pop("step") for p, st in inner.items() if "step" in st}
        opt.load_parameter_state_from_fully_reshardable(param_state)
        for p, step in steps.items():
            inner[p]["step"] = step.detach().clone()


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    return dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                tracker=tensor_parallel.get_cuda_rng_tracker().get_states())


def _maybe_restore_rng(directory: str, saved_layout: dict | None, state: ParallelState) -> None:
    from megatron.core import tensor_parallel

    if saved_layout != _layout(state):
        logger.warning("RNG state not restored: checkpoint layout %s differs from %s",
                       saved_layout, _layout(state))
        return
    rng = torch.load(os.path.join(directory, "rng", f"rank{dist.get_rank()}.pt"), weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
