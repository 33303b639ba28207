"""megatron distributed checkpoints of an engine's model (layout-independent).

A checkpoint saved at one (TP, PP) loads at any other: every tensor is stored with its
global shape and each rank reads only its own slice.

Note: megatron's torch_dist writer starts a spawn-context multiprocessing helper, so a
script that saves must guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import os

from verl_mp.engine.runtime import megatron_scope


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
