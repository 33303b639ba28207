"""Reading HF safetensors checkpoints: validation up front, then slice-wise reads.

`open_hf_checkpoint` reads only ``config.json``, the index and the safetensors headers
(no tensor data), and raises a ValueError/FileNotFoundError naming the file and the
fix for: an unsupported architecture, a missing shard, a missing or unexpected tensor,
or a tensor whose shape does not match the config. `SliceReader` then reads just the
rows/columns a rank needs (safetensors memory-maps; only the slice is copied).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors import safe_open

from verl_mp.models.convert import SliceRead, expected_hf_shapes
from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.models.spec import GPTSpec

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Buffers some exporters keep in the checkpoint; recomputed, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class HFCheckpoint:
    path: Path
    config: dict
    spec: GPTSpec
    weight_map: dict[str, str]
    """HF tensor name -> safetensors file name (relative to ``path``)."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)

    @property
    def has_weights(self) -> bool:
        """False for a config-only directory (e.g. the ``hf/`` copy inside an engine checkpoint)."""
        return bool(self.weight_map)

    @property
    def torch_dtype(self) -> str | None:
        return self.config.get("dtype") or self.config.get("torch_dtype")


def read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found: --model must be an HF checkpoint directory")
    with open(config_file) as f:
        return json.load(f)


def _weight_map(path: Path, allow_missing: bool = False) -> dict[str, str]:
    index = path / INDEX_FILE
    if index.is_file():
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    single = path / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), "pt") as f:
            return {name: SINGLE_FILE for name in f.keys()}
    if allow_missing and not any(path.glob("*.bin")) and not any(path.glob("*.safetensors")):
        return {}
    raise FileNotFoundError(f"{path}: neither {INDEX_FILE} nor {SINGLE_FILE} found "
                            f"(only safetensors checkpoints are supported)")


def _read_headers(path: Path, weight_map: dict[str, str]) -> tuple[dict, dict]:
    shapes, dtypes = {}, {}
    for file in sorted(set(weight_map.values())):
        shard = path / file
        if not shard.is_file():
            raise FileNotFoundError(f"shard {shard} listed in {path / INDEX_FILE} is missing; "
                                    f"re-download or re-export the checkpoint")
        with safe_open(str(shard), "pt") as f:
            present = set(f.keys())
            for name in (n for n, fl in weight_map.items() if fl == file):
                if name not in present:
                    raise ValueError(f"{shard} does not contain {name!r}, which {INDEX_FILE} maps to it")
                sl = f.get_slice(name)
                shapes[name], dtypes[name] = tuple(sl.get_shape()), sl.get_dtype()
    return shapes, dtypes


def open_hf_checkpoint(path: str | Path, *, value_head: bool = False,
                       config_only: bool = False) -> HFCheckpoint:
    """Validate an HF checkpoint directory against its config; return its description.

    ``value_head=True`` (critic) accepts a causal-LM checkpoint: its ``lm_head`` is ignored
    and the value head starts fresh unless the checkpoint has ``score.*`` tensors.
    ``config_only=True`` accepts a directory without weight files (``has_weights`` False).
    """
    path = Path(path)
    config = read_config(path)
    spec = spec_from_hf_config(config, source=str(path / "config.json"))
    if value_head:
        spec = replace(spec, value_head=True, tie_word_embeddings=False)
    weight_map = _weight_map(path, allow_missing=config_only)
    shapes, dtypes = _read_headers(path, weight_map)
    ckpt = HFCheckpoint(path, config, spec, weight_map, shapes, dtypes)
    if ckpt.has_weights:
        check_tensors(ckpt)
    return ckpt


def check_tensors(ckpt: HFCheckpoint) -> None:
    """Every tensor the config implies is present with its shape; nothing unexpected."""
    expected = expected_hf_shapes(ckpt.spec)
    where = ckpt.path / (INDEX_FILE if (ckpt.path / INDEX_FILE).is_file() else SINGLE_FILE)
    for name, shape in expected.items():
        if name not in ckpt.shapes:
            if name.startswith("score.") and ckpt.spec.value_head:
                logger.info("%s has no %s: the value head starts from its initialisation", where, name)
                continue
            raise ValueError(f"{where}: tensor {name!r} is missing (the config of "
                             f"{ckpt.spec.architecture} requires it)")
        if ckpt.shapes[name] != shape:
            raise ValueError(f"{ckpt.path / ckpt.weight_map[name]}: tensor {name!r} has shape "
                             f"{list(ckpt.shapes[name])} but config.json implies {list(shape)}; "
                             f"the config does not belong to these weights")
    for name in ckpt.shapes:
        if name in expected or name.endswith(_IGNORED_SUFFIXES) or _ignorable(name, ckpt.spec):
            continue
        raise ValueError(f"{ckpt.path / ckpt.weight_map[name]}: unexpected tensor {name!r} for "
                         f"{ckpt.spec.architecture} with this config (a bias or norm the config "
                         f"does not declare?); refusing to drop weights silently")


def _ignorable(name: str, spec: GPTSpec) -> bool:
    # Tied checkpoints sometimes store lm_head anyway; a critic ignores the LM head.
    return name == "lm_head.weight" and (spec.tie_word_embeddings or spec.value_head)


class SliceReader:
    """Reads `SliceRead`s from a checkpoint, keeping each shard file open once."""

    def __init__(self, ckpt: HFCheckpoint):
        self.ckpt = ckpt
        self._files: dict[str, object] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self._files.values():
            handle.__exit__(None, None, None)
        self._files.clear()
        return False

    def _file(self, name: str):
        file = self.ckpt.weight_map[name]
        if file not in self._files:
            handle = safe_open(str(self.ckpt.path / file), "pt")
            self._files[file] = handle.__enter__()
        return self._files[file]

    def read(self, read: SliceRead) -> torch.Tensor:
        sl = self._file(read.hf_name).get_slice(read.hf_name)
        if read.dim is None:
            return sl[:]
        index = [slice(None)] * len(sl.get_shape())
        index[read.dim] = slice(read.start, read.stop)
        return sl[tuple(index)]
