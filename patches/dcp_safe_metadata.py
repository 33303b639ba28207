"""Read torch.distributed.checkpoint metadata without running code from the checkpoint.

Upstream: torch 2.13 (also every earlier 2.x). ``FileSystemReader.read_metadata``
(`torch/distributed/checkpoint/filesystem.py`) reads a checkpoint's ``.metadata`` with a
plain ``pickle.load``: whoever can write a checkpoint directory can run code in every rank
that loads it (megatron-core's ``torch_dist`` format reads it on every load). The tensors
themselves are safe: DCP reads byte items with ``torch.load(weights_only=True)``.

What this shim does: ``install()`` gives the filesystem module a ``pickle`` whose ``load``
is a restricted unpickler: it builds only the classes a DCP metadata file is made of
(``Metadata`` and its storage/index records, ``SavePlan`` items, ``torch.Size``, dtypes,
layouts) and refuses every other global with an ``UnpicklingError`` that names the file.
``dump`` and the rest are the real ``pickle``'s, so writing is unchanged.

Remove when torch reads DCP metadata with ``weights_only`` or a restricted unpickler.
"""

from __future__ import annotations

import pickle
from typing import Any

# (module, name) pairs a DCP metadata file may reference; measured on megatron-core 0.16.1
# torch_dist checkpoints (model, fully_reshardable optimizer, byte extra states) and on
# torch's own FileSystemWriter.
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.planner": frozenset({
        "SavePlan", "LoadPlan", "WriteItem", "ReadItem", "WriteItemType", "LoadItemType",
        "TensorWriteData"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id
    "builtins": frozenset({"set", "frozenset", "slice", "complex"}),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any):
        super().__init__(file)
        self._name = getattr(file, "name", "<stream>")

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()) or (module == "torch" and _is_dtype(name)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{self._name}: refusing to load {module}.{name}: a checkpoint's .metadata may only "
            "hold torch.distributed.checkpoint records. The checkpoint was not written by this "
            "trainer or has been tampered with; do not load it.")


def _is_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


class _SafePickle:
    """The ``pickle`` module with a restricted ``load``."""

    UnpicklingError = pickle.UnpicklingError

    @staticmethod
    def load(file: Any, **_kwargs: Any) -> Any:
        return _MetadataUnpickler(file).load()

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


def install() -> None:
    """Make DCP's filesystem reader load metadata with the restricted unpickler (idempotent)."""
    from torch.distributed.checkpoint import filesystem

    if not isinstance(filesystem.pickle, _SafePickle):
        filesystem.pickle = _SafePickle()
