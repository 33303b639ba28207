"""HF safetensors <-> this rank's megatron shards.

Loading: every rank reads only the HF slices of its own TP/PP shard (`tp_shard_plan`);
for a mixture-of-experts model only its own experts' tensors, sliced for its expert-TP rank.
Export: parameters are TP-gathered one at a time inside each pipeline stage (routed
experts over their expert-TP group); TP rank 0 of DP rank 0 of every stage writes its
stage's tensors, and expert-TP rank 0 of expert-DP rank 0 of every expert-parallel rank
writes its experts, each writer into its own safetensors shard files (at most
``max_shard_bytes`` each, so no rank ever holds more than its shard of the model plus one
file); global rank 0 then names the files ``model-0000i-of-0000n``, writes the index, the
config and the tokenizer files. ``out_dir`` must be visible to all ranks.

Crash safety: everything is written into ``.<name>.staging`` next to ``out_dir`` (each writer
fsyncs its shards) and published in one step (`verl_mp.utils.fs.publish_dir`): ``out_dir`` is
the old export or the new one, never new shards beside a stale ``model.safetensors`` or an
index naming files of both. After a crash between the two renames the old export waits at
``.<name>.replaced`` and the next export puts it back before it starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from verl_mp.engine.layout import ParamInfo, megatron_param_layout
from verl_mp.engine.runtime import ParallelState
from verl_mp.models.convert import hf_export_dtype, hf_to_megatron, megatron_to_hf, tp_shard_plan
from verl_mp.models.hf_checkpoint import INDEX_FILE, HFCheckpoint, SliceReader
from verl_mp.models.registry import causal_lm_to_critic_name
from verl_mp.models.spec import GPTSpec
from verl_mp.utils.fs import fsync_path, fsync_tree, publish_dir, recover_publish

logger = logging.getLogger(__name__)

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5")


def _tp_coords(info: ParamInfo, state: ParallelState) -> tuple[int, int]:
    """(rank, size) of the group ``info`` is split over: expert-TP for routed experts, else TP."""
    if info.tp_dim is None:
        return 0, 1
    return (state.etp_rank, state.etp_size) if info.expert else (state.tp_rank, state.tp_size)


def read_local_shard(spec: GPTSpec, info: ParamInfo, state: ParallelState,
                     reader: SliceReader) -> torch.Tensor | None:
    """This rank's shard of one parameter, read from HF slices; None if absent (value head)."""
    plan = tp_shard_plan(spec, info.global_name, *_tp_coords(info, state))
    if any(r.hf_name not in reader.ckpt.weight_map for r in plan.reads):
        return None
    slices = {r.hf_name: reader.read(r) for r in plan.reads}
    shard = hf_to_megatron(spec, info.global_name, slices)
    if plan.pad_rows:
        shard = torch.cat([shard, shard.new_zeros(plan.pad_rows, *shard.shape[1:])])
    return shard


def load_hf_weights(chunks: list, ckpt: HFCheckpoint, state: ParallelState) -> int:
    """Copy the checkpoint into ``chunks`` in place; return the number of parameters set."""
    loaded = 0
    with SliceReader(ckpt) as reader, torch.no_grad():
        for info in megatron_param_layout(chunks, state):
            shard = read_local_shard(ckpt.spec, info, state, reader)
            if shard is None:
                continue
            if tuple(shard.shape) != tuple(info.param.shape):
                raise ValueError(f"{ckpt.path}: {info.global_name} built from HF tensors has shape "
                                 f"{list(shard.shape)}, the model expects {list(info.param.shape)}")
            info.param.copy_(shard)
            loaded += 1
    logger.info("loaded %d parameters from %s (tp_rank %d, pp_rank %d)", loaded, ckpt.path,
                state.tp_rank, state.pp_rank)
    return loaded


def _gather_full(info: ParamInfo, state: ParallelState) -> torch.Tensor:
    shard = info.param.detach()
    if info.tp_dim is None:
        return shard
    _, size = _tp_coords(info, state)
    shards = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(shards, shard.contiguous(), group=state.etp_group if info.expert else state.tp_group)
    return info.merge_tp_shards(shards)


def _exports(info: ParamInfo, state: ParallelState) -> tuple[bool, bool]:
    """(gathers, writes): the one replica of ``info`` that exports it (DP rank 0; for routed
    experts expert-DP rank 0, one per expert-parallel rank) gathers it over its TP group,
    and that group's rank 0 writes it."""
    if info.expert:
        return state.edp_rank == 0, state.edp_rank == 0 and state.etp_rank == 0
    return state.dp_rank == 0, state.dp_rank == 0 and state.tp_rank == 0


class _ShardWriter:
    """Accumulates HF tensors and writes ``_rank{r}-{k}.safetensors`` files of bounded size."""

    def __init__(self, out_dir: Path, rank: int, max_bytes: int):
        self.out_dir, self.rank, self.max_bytes = out_dir, rank, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.files: list[tuple[str, list[str], int]] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self.pending and self._bytes() + tensor.numel() * tensor.element_size() > self.max_bytes:
            self.flush()
        self.pending[name] = tensor

    def _bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.pending.values())

    def flush(self) -> None:
        if not self.pending:
            return
        file = f"_rank{self.rank:05d}-{len(self.files):05d}.safetensors"
        save_file(self.pending, str(self.out_dir / file), metadata={"format": "pt"})
        fsync_path(str(self.out_dir / file))  # by its writer: another node's fsync may not flush it
        self.files.append((file, list(self.pending), self._bytes()))
        self.pending = {}


def export_hf_weights(chunks: list, spec: GPTSpec, state: ParallelState, out_dir: str | Path, *,
                      dtype: torch.dtype, source_dir: str | Path | None,
                      max_shard_bytes: int = 2 << 30) -> None:
    """Write ``chunks`` as an HF checkpoint (safetensors shards + index + config + tokenizer).

    Collective over all ranks. ``source_dir`` provides ``config.json`` and the tokenizer
    files (copied unchanged, except the config's dtype/critic fields when they differ).
    The export appears at ``out_dir`` all at once, replacing an earlier one there.
    """
    out_dir = Path(out_dir)
    staging, _ = staging_paths(out_dir)
    if dist.get_rank() == 0:
        prepare_staging(out_dir)
    dist.barrier()
    writer = _ShardWriter(staging, dist.get_rank(), max_shard_bytes)
    for info in megatron_param_layout(chunks, state):
        gathers, writes = _exports(info, state)
        if not gathers:
            continue
        full = _gather_full(info, state)
        if writes:
            for name, tensor in megatron_to_hf(spec, info.global_name, full):
                writer.add(name, tensor.detach().to(dtype=hf_export_dtype(name, dtype), device="cpu", copy=True))
    writer.flush()
    everything = [None] * dist.get_world_size()
    dist.all_gather_object(everything, writer.files)
    if dist.get_rank() == 0:
        files = [f for per_rank in everything for f in per_rank]
        publish_export(out_dir, sorted(files), spec, dtype, source_dir)
    dist.barrier()


def publish_export(out_dir: Path, files: list, spec: GPTSpec, dtype: torch.dtype, source_dir) -> None:
    """Rank 0, once every shard is in the staging dir: finish it there, then publish it."""
    staging, replaced = staging_paths(out_dir)
    _finalise(staging, files, spec, dtype, source_dir)
    fsync_tree(str(staging))
    publish_dir(str(staging), str(out_dir), str(replaced))
    logger.info("exported %d files to %s", len(files), out_dir)


def staging_paths(out_dir: Path) -> tuple[Path, Path]:
    """(where an export is written, where the previous export waits while it is replaced)."""
    return out_dir.parent / f".{out_dir.name}.staging", out_dir.parent / f".{out_dir.name}.replaced"


def prepare_staging(out_dir: Path) -> Path:
    """Rank 0: undo what an interrupted export left (the previous export goes back to
    ``out_dir``), then an empty staging dir."""
    staging, replaced = staging_paths(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if recover_publish(str(out_dir), str(replaced), staging_complete=False, staging=str(staging)):
        logger.warning("%s: restored the export an interrupted export had moved aside", out_dir)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


def _finalise(out_dir: Path, files: list, spec: GPTSpec, dtype: torch.dtype, source_dir) -> None:
    """Rank 0, inside the staging dir: final shard names, the index, config and tokenizer."""
    total = len(files)
    weight_map, size = {}, 0
    for i, (tmp, names, nbytes) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        os.replace(out_dir / tmp, out_dir / final)
        weight_map.update({n: final for n in names})
        size += nbytes
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    with open(out_dir / INDEX_FILE, "w") as f:
        json.dump(index, f, indent=2)
    if source_dir is not None:
        copy_config_and_tokenizer(Path(source_dir), out_dir, spec, dtype)


def copy_config_and_tokenizer(source: Path, out_dir: Path, spec: GPTSpec, dtype: torch.dtype) -> None:
    """Copy tokenizer/generation files as they are; rewrite config.json only if needed."""
    for item in source.iterdir():
        if item.is_file() and item.name != "config.json" and not item.name.endswith(_WEIGHT_SUFFIXES) \
                and item.name != INDEX_FILE:
            shutil.copy2(item, out_dir / item.name)
    with open(source / "config.json") as f:
        config = json.load(f)
    name = next(k for k, v in DTYPE_NAMES.items() if v == dtype)
    changed = dict(config)
    for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]:
        changed[key] = name
    if spec.value_head and "ForCausalLM" in config["architectures"][0]:
        changed.update(architectures=[causal_lm_to_critic_name(config["architectures"][0])], num_labels=1)
        changed.pop("id2label", None), changed.pop("label2id", None)
    if changed == config:
        shutil.copy2(source / "config.json", out_dir / "config.json")
    else:
        with open(out_dir / "config.json", "w") as f:
            json.dump(changed, f, indent=2)
