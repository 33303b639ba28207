"""Weights from the actor's processes to a rollout on ranks of its own, over the collective
backend (NCCL on GPUs, gloo on CPU), bucket by bucket.

The actor group and the rollout group each have their own torch.distributed world (Ray
starts them as separate groups), so ``dist.new_group`` cannot span them. A
`WeightChannel` is a process group of its own, outside both worlds: the backend's process
group class built directly on a TCP store that the sender serves (on the address the
driver reserved in that process, `verl_mp.utils.net`), with a prefix per channel. Members:
channel rank 0 is the actor's global rank 0 (the sender), ranks 1..R are the rollout's
ranks. Collectives are called on the group object; nothing is registered in either world,
so the groups' own collectives are untouched.

Every sync: all actor ranks run the gather-mode `WeightSync` generator (TP all-gathers and
PP broadcasts inside the actor group), so the sender holds each full HF tensor in turn; it
packs them into flat buckets of ``rollout.weight_sync_bucket_mb`` and broadcasts each. The
receivers know the layout from a manifest the sender published once in the store (JSON:
names, shapes, dtype; never pickle, the store has no authentication), receive each bucket
into a fresh buffer and hand its tensors to vLLM's in-place reload, which slices its own TP
part. One bucket is in flight while the next is filled (sender) or loaded (receivers).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_mp.models.registry import FP32_HF_TENSORS
from verl_mp.utils.buckets import pack_buckets
from verl_mp.utils.dtypes import TORCH_DTYPES
from verl_mp.utils.net import create_store

logger = logging.getLogger(__name__)

MANIFEST_KEY = "manifest"


@dataclass(frozen=True)
class Manifest:
    """What one sync moves: HF-named tensors in send order, grouped into buckets of the model's
    dtype, but for the tensors the rollout keeps in fp32 (`FP32_HF_TENSORS`, DeepSeek-V3's
    routing bias), which travel in fp32 buckets of their own."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    dtype: str
    """A key of `verl_mp.utils.dtypes.TORCH_DTYPES` (fp32, bf16, fp16)."""
    buckets: list[list[int]]
    """Indices into ``names``, consecutive, each bucket at most the bucket size (a tensor
    larger than that gets a bucket of its own)."""
    fp32: list[int] = field(default_factory=list)
    """Indices into ``names`` sent in fp32 whatever ``dtype`` (never sharing a bucket with others)."""

    @classmethod
    def plan(cls, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, bucket_bytes: int) -> Manifest:
        """Bucket ``shapes`` (name -> shape, in send order) for ``bucket_bytes``-sized buffers."""
        names = list(shapes)
        fp32 = [i for i, n in enumerate(names) if n.endswith(FP32_HF_TENSORS)] if dtype != torch.float32 else []
        wide = set(fp32)
        sizes = [_numel(s) * (torch.float32 if i in wide else dtype).itemsize for i, s in enumerate(shapes.values())]
        buckets = pack_buckets(sizes, bucket_bytes, lambda first, i: (i in wide) == (first in wide))
        key = next(k for k, v in TORCH_DTYPES.items() if v == dtype)
        return cls(names, [tuple(s) for s in shapes.values()], key, buckets, fp32)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def bucket_dtype(self, bucket: list[int]) -> torch.dtype:
        return torch.float32 if bucket[0] in self.fp32 else self.torch_dtype

    def bucket_numel(self, bucket: list[int]) -> int:
        return sum(_numel(self.shapes[i]) for i in bucket)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_numel(b) * self.bucket_dtype(b).itemsize for b in self.buckets)

    def to_json(self) -> str:
        return json.dumps({"names": self.names, "shapes": [list(s) for s in self.shapes], "dtype": self.dtype,
                           "buckets": self.buckets, "fp32": self.fp32})

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        d = json.loads(text)
        return cls(d["names"], [tuple(s) for s in d["shapes"]], d["dtype"], d["buckets"], d.get("fp32", []))


@dataclass
class TransferStats:
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    """Wall time of the whole transfer on this rank (first bucket to the last one loaded)."""
    wait_seconds: float = 0.0
    """Time blocked in collectives waiting for the other side (or the wire)."""
    extra: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "rollout/transfer") -> dict[str, float]:
        gb = self.bytes / 1e9
        return {f"{prefix}_bytes": float(self.bytes), f"{prefix}_buckets": float(self.buckets),
                f"{prefix}_s": self.seconds, f"{prefix}_wait_s": self.wait_seconds,
                f"{prefix}_s_per_gb": self.seconds / gb if gb else 0.0, **self.extra}


class WeightChannel:
    """A broadcast group between one sender (channel rank 0) and the rollout's ranks."""

    def __init__(self, store, rank: int, world_size: int, timeout: datetime.timedelta):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.layout: Manifest | None = None
        """What every sync moves (`agree`)."""
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        if torch.cuda.is_available():
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    @classmethod
    def open(cls, host: str, port: int, rank: int, world_size: int, name: str = "weights",
             timeout_minutes: float = 30) -> WeightChannel:
        """Join the channel (collective over its ``world_size`` members): rank 0 serves the
        store on ``host:port`` (a port it reserved, `verl_mp.utils.net.reserve_port`)."""
        timeout = datetime.timedelta(minutes=timeout_minutes)
        store = create_store(host, port, rank, world_size, timeout)
        return cls(dist.PrefixStore(f"verl_mp/{name}", store), rank, world_size, timeout)

    @property
    def is_sender(self) -> bool:
        return self.rank == 0

    def broadcast(self, tensor: torch.Tensor):
        """Start broadcasting ``tensor`` from the sender; returns the work to wait on."""
        return self.pg.broadcast(tensor, 0)

    def agree(self, manifest: Manifest | None = None) -> Manifest:
        """The sender publishes ``manifest`` in the store; every member reads it (waiting
        for it) into ``layout``."""
        if self.is_sender:
            if manifest is None:
                raise ValueError("the weight channel's sender must give the manifest")
            self.store.set(MANIFEST_KEY, manifest.to_json())
        self.layout = Manifest.from_json(self.store.get(MANIFEST_KEY))
        return self.layout

    def barrier(self) -> None:
        self.broadcast(torch.zeros(1, device=self.device)).wait()


def send(channel: WeightChannel, weights: Iterable[tuple[str, torch.Tensor]], stats: TransferStats) -> None:
    """Sender: pack ``weights`` (in manifest order) into buckets and broadcast each, one bucket
    in flight while the next is filled. ``weights`` must be consumed fully on every actor
    rank (it runs the actor group's collectives), so non-senders call `drain`."""
    start, manifest = time.perf_counter(), channel.layout
    it = iter(weights)
    in_flight = None
    for bucket in manifest.buckets:
        flat = torch.empty(manifest.bucket_numel(bucket), dtype=manifest.bucket_dtype(bucket), device=channel.device)
        offset = 0
        for i in bucket:
            name, tensor = next(it)
            if name != manifest.names[i] or tuple(tensor.shape) != manifest.shapes[i]:
                raise RuntimeError(f"weight channel: the sync yielded {name} {tuple(tensor.shape)} where the manifest "
                                   f"has {manifest.names[i]} {manifest.shapes[i]}")
            n = tensor.numel()
            flat[offset: offset + n].copy_(tensor.reshape(-1))
            offset += n
        in_flight = _wait(in_flight, stats)
        in_flight = (channel.broadcast(flat), flat)
        stats.bytes += flat.numel() * flat.element_size()
        stats.buckets += 1
    _wait(in_flight, stats)
    if next(it, None) is not None:
        raise RuntimeError("weight channel: the sync yielded more tensors than the manifest lists")
    stats.seconds = time.perf_counter() - start


def receive(channel: WeightChannel, stats: TransferStats) -> Iterator[tuple[str, torch.Tensor]]:
    """Receivers: yield ``(name, tensor)`` of every bucket, receiving the next bucket while the
    consumer loads this one. Each bucket gets a fresh buffer: vLLM's reload may hold on to a
    layer's tensors until the layer is complete."""
    start, manifest = time.perf_counter(), channel.layout

    def post(k: int):
        flat = torch.empty(manifest.bucket_numel(manifest.buckets[k]), dtype=manifest.bucket_dtype(manifest.buckets[k]),
                           device=channel.device)
        return channel.broadcast(flat), flat

    pending = post(0) if manifest.buckets else None
    for k, bucket in enumerate(manifest.buckets):
        flat = _wait(pending, stats)
        pending = post(k + 1) if k + 1 < len(manifest.buckets) else None
        stats.bytes += flat.numel() * flat.element_size()
        stats.buckets += 1
        offset = 0
        for i in bucket:
            n = _numel(manifest.shapes[i])
            yield manifest.names[i], flat[offset: offset + n].view(manifest.shapes[i])
            offset += n
    stats.seconds = time.perf_counter() - start


def drain(weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run the sync generator to its end on an actor rank that sends nothing."""
    for _ in weights:
        pass


def _wait(pending, stats: TransferStats):
    """Wait for an in-flight ``(work, buffer)``; returns the buffer (None if nothing pends)."""
    if pending is None:
        return None
    work, flat = pending
    start = time.perf_counter()
    work.wait()
    stats.wait_seconds += time.perf_counter() - start
    return flat


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
