"""Megatron (TP/PP/VPP shards) -> HF-named full tensors for the rollout engine, bucketed.

Every rank runs the same generator; it is consumed by the rollout backend's
``load_weights`` (vLLM's ``reload_weights`` takes its own TP slice of each full tensor).

Per bucket (``rollout.weight_sync_bucket_mb``) of one pipeline stage's parameters:
1. on that stage, each parameter is all-gathered inside its TP group (only tensors split
   over TP; replicated ones are copied) and merged into the TP=1 layout, straight into
   a flat bucket buffer;
2. the bucket is broadcast from that stage to the other stages of the PP group;
3. every rank converts the bucket's tensors to HF names/layouts and yields them.
No rank ever holds the full model: beyond its own shards a rank holds one bucket plus
one gathered tensor at a time (`SyncStats.peak_transient_bytes` records the high-water
mark, and a test checks it against that bound).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_mp.engine.layout import megatron_param_layout
from verl_mp.engine.runtime import ParallelState
from verl_mp.models.convert import megatron_to_hf
from verl_mp.models.spec import GPTSpec


@dataclass(frozen=True)
class _Entry:
    global_name: str
    full_shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.full_shape:
            n *= d
        return n


@dataclass
class SyncStats:
    bytes_synced: int = 0
    """Bytes of full (TP-merged) megatron tensors moved into the rollout engine."""
    num_buckets: int = 0
    peak_transient_bytes: int = 0
    """Largest (bucket + gather temporaries) this rank held at once."""
    largest_tensor_bytes: int = 0
    seconds: float = 0.0
    _live: int = field(default=0, repr=False)

    def hold(self, nbytes: int) -> None:
        self._live += nbytes
        self.peak_transient_bytes = max(self.peak_transient_bytes, self._live)

    def release(self, nbytes: int) -> None:
        self._live -= nbytes


class WeightSync:
    def __init__(self, spec: GPTSpec, chunks: list, state: ParallelState, bucket_mb: int):
        self.spec = spec
        self.state = state
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.infos = megatron_param_layout(chunks, state)
        self.stage_entries = self._exchange_entries()
        self.last_stats = SyncStats()

    def _local_entries(self) -> list[_Entry]:
        out = []
        for info in self.infos:
            shape = list(info.param.shape)
            if info.tp_dim is not None:
                shape[info.tp_dim] *= self.state.tp_size
            out.append(_Entry(info.global_name, tuple(shape), info.param.dtype))
        return out

    def _exchange_entries(self) -> list[list[_Entry]]:
        """Every stage's parameter list (metadata only), identical on all ranks."""
        local = self._local_entries()
        if self.state.pp_size == 1:
            return [local]
        parts: list = [None] * self.state.pp_size
        dist.all_gather_object(parts, local, group=self.state.pp_group)
        return parts

    def _buckets(self, entries: list[_Entry]) -> list[list[int]]:
        buckets, current, size = [], [], 0
        for i, e in enumerate(entries):
            nbytes = e.numel * e.dtype.itemsize
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        return buckets

    def iter_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, tensor)`` for the whole model, bucket by bucket (collective:
        every rank must consume the iterator fully and in step)."""
        stats = SyncStats()
        self.last_stats = stats
        start = time.perf_counter()
        for stage, entries in enumerate(self.stage_entries):
            for bucket in self._buckets(entries):
                flat = self._fill_bucket(stage, entries, bucket, stats)
                yield from self._convert(entries, bucket, flat)
                stats.release(flat.numel() * flat.element_size())
                del flat
        stats.seconds = time.perf_counter() - start

    def _fill_bucket(self, stage: int, entries: list[_Entry], bucket: list[int], stats: SyncStats) -> torch.Tensor:
        dtype = entries[bucket[0]].dtype
        numel = sum(entries[i].numel for i in bucket)
        device = self.infos[0].param.device if self.infos else torch.device("cpu")
        flat = torch.empty(numel, dtype=dtype, device=device)
        stats.hold(flat.numel() * flat.element_size())
        if stage == self.state.pp_rank:
            offset = 0
            for i in bucket:
                e = entries[i]
                self._gather_into(self.infos[i], flat[offset: offset + e.numel].view(e.full_shape), stats)
                offset += e.numel
        if self.state.pp_size > 1:
            src = dist.get_global_rank(self.state.pp_group, stage)
            dist.broadcast(flat, src=src, group=self.state.pp_group)
        stats.num_buckets += 1
        stats.bytes_synced += flat.numel() * flat.element_size()
        return flat

    def _gather_into(self, info, out: torch.Tensor, stats: SyncStats) -> None:
        """Write this parameter in the TP=1 layout (padded vocab) into ``out``.

        A TP-split parameter is all-gathered into one temporary of its full size, then
        concatenated (reordered for the fused gate/up) straight into the bucket."""
        param = info.param.detach()
        if info.tp_dim is None:
            out.copy_(param)
            return
        nbytes = param.numel() * param.element_size() * self.state.tp_size
        stats.largest_tensor_bytes = max(stats.largest_tensor_bytes, nbytes)
        shards = [torch.empty_like(param) for _ in range(self.state.tp_size)]
        stats.hold(nbytes)
        dist.all_gather(shards, param.contiguous(), group=self.state.tp_group)
        info.merge_tp_shards(shards, out=out)
        stats.release(nbytes)

    def _convert(self, entries: list[_Entry], bucket: list[int], flat: torch.Tensor):
        offset = 0
        for i in bucket:
            e = entries[i]
            tensor = flat[offset: offset + e.numel].view(e.full_shape)
            offset += e.numel
            yield from megatron_to_hf(self.spec, e.global_name, tensor)
