"""Free device memory between uses: parameters, gradient buffers, optimizer state.

Works on tensor *storages*: a storage is copied to host memory (pinned with CUDA) and
resized to zero bytes; `onload` resizes it back and copies the bytes in. Every tensor
viewing the storage (megatron's parameters are views into contiguous DDP buffers, fp32
DistributedOptimizer shards are views into those) stays a valid object and sees the same
values after `onload`. Storages shared by several tensors are moved once. On a CPU-only
machine the mechanics are the same (useful for tests), only nothing is gained.
"""

from __future__ import annotations

import torch


class StorageOffloader:
    def __init__(self):
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}

    @property
    def offloaded(self) -> bool:
        return bool(self._saved)

    def offload(self, tensors) -> int:
        """Move the storages of ``tensors`` to host memory; return the bytes freed."""
        freed = 0
        for tensor in tensors:
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._saved or storage.nbytes() == 0:
                continue
            host = torch.empty(storage.nbytes(), dtype=torch.uint8,
                               pin_memory=storage.device.type == "cuda").untyped_storage()
            host.copy_(storage)
            freed += storage.nbytes()
            storage.resize_(0)
            self._saved[key] = (storage, host)
        return freed

    def onload(self) -> None:
        """Bring every offloaded storage back to its device with its old contents."""
        for storage, host in self._saved.values():
            storage.resize_(host.nbytes())
            storage.copy_(host)
        self._saved.clear()


def _ddp_buffers(chunk) -> list:
    """megatron DDP's list of contiguous param/grad buffers; [] for an unwrapped module (whose
    ``buffers`` is nn.Module's method, e.g. a reference policy without an optimizer)."""
    buffers = getattr(chunk, "buffers", None)
    return list(buffers) if isinstance(buffers, (list, tuple)) else []


def grad_buffer_tensors(chunks: list) -> list[torch.Tensor]:
    """The contiguous gradient buffers of megatron-DDP-wrapped chunks."""
    return [buf.grad_data for c in chunks for buf in _ddp_buffers(c) if buf.grad_data is not None]


def param_tensors(chunks: list) -> list[torch.Tensor]:
    """Contiguous DDP parameter buffers when wrapped, else every parameter."""
    tensors = []
    for chunk in chunks:
        buffers = _ddp_buffers(chunk)
        if buffers:
            tensors += [buf.param_data for buf in buffers if buf.param_data is not None]
        else:
            tensors += [p.data for p in chunk.parameters()]
    return tensors


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """fp32 main parameters and Adam moments of a megatron (chained) optimizer."""
    tensors = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            tensors += [p.data for p in group["params"]]
        for state in inner.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
    return tensors
