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

Loading runs no code from the checkpoint: RNG files hold only tensors, ints and floats and are
read with ``torch.load(weights_only=True)``; megatron's ``common.pt`` is read the same way by
torch's default; DCP's ``.metadata`` pickle goes through `verl_mp.patches.dcp_safe_metadata`.
A file that wants anything else is refused with an error naming it. Every rank fsyncs the
files it writes (the checkpoint manager publishes the directory after a barrier).

Note: megatron's torch_dist writer starts a spawn-context multiprocessing helper, so a
script that saves must guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random

import numpy as np
import torch
import torch.distributed as dist

from verl_mp.engine.runtime import ParallelState, megatron_scope
from verl_mp.patches import dcp_safe_metadata
from verl_mp.utils.fs import fsync_path

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
    dcp_safe_metadata.install()
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
    rng_path = os.path.join(directory, "rng", f"rank{dist.get_rank()}.pt")
    with open(rng_path, "wb") as f:
        torch.save(_rng_state(), f)
        _flush_to_disk(f)
    if dist.get_rank() == 0:
        with open(os.path.join(directory, META_FILE), "w") as f:
            json.dump({"layout": _layout(state), **(extra or {})}, f, indent=2)
            _flush_to_disk(f)
        for name in ("common.pt", "metadata.json"):  # megatron writes these on rank 0 without fsync
            if os.path.exists(os.path.join(directory, name)):
                fsync_path(os.path.join(directory, name))
    dist.barrier()


def _flush_to_disk(f) -> None:
    """The writer fsyncs its own file: on a shared filesystem another node's fsync may not."""
    f.flush()
    os.fsync(f.fileno())


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
    dcp_safe_metadata.install()
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
    """Every RNG of this rank as tensors, ints and floats only (loadable with weights_only)."""
    from megatron.core import tensor_parallel

    py_version, py_keys, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return dict(python=dict(version=py_version, keys=torch.tensor(py_keys, dtype=torch.int64), gauss=py_gauss),
                numpy=dict(keys=torch.from_numpy(np_keys.astype(np.int64)), pos=int(np_pos),
                           has_gauss=int(np_has_gauss), gauss=float(np_gauss)),
                torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                tracker=dict(tensor_parallel.get_cuda_rng_tracker().get_states()))


def load_rng_file(path: str) -> dict:
    """Read an ``rng/rank{r}.pt`` file without running code from it (``weights_only=True``)."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(
            f"{path}: refusing to load: it holds objects other than tensors and numbers, so "
            f"loading it could run code ({err}). Do not resume from a checkpoint you did not "
            "write; delete this file to resume without its RNG state.") from None


def _set_rng_state(rng: dict) -> None:
    from megatron.core import tensor_parallel

    py, npy = rng["python"], rng["numpy"]
    # Tuples: a checkpoint written before the states were stored as tensors (it loads with
    # weights_only thanks to megatron-core's safe globals for numpy arrays).
    random.setstate(py if isinstance(py, tuple) else (py["version"], tuple(py["keys"].tolist()), py["gauss"]))
    np.random.set_state(npy if isinstance(npy, tuple) else (
        "MT19937", npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])


def _maybe_restore_rng(directory: str, saved_layout: dict | None, state: ParallelState) -> None:
    if saved_layout != _layout(state):
        logger.warning("RNG state not restored: checkpoint layout %s differs from %s",
                       saved_layout, _layout(state))
        return
    _set_rng_state(load_rng_file(os.path.join(directory, "rng", f"rank{dist.get_rank()}.pt")))
