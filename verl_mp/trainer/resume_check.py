"""Refuse to resume a checkpoint that a different run wrote.

Every checkpoint holds the resolved ``config.yaml`` of the run that wrote it and, in
``trainer_state.json``, a fingerprint of that run's model directory (`model_fingerprint`).
Before it resumes, the trainer compares both with the current run (`check_resume`):

- config: every field must be equal, except those in ``MAY_DIFFER``: where, how long and
  on how many ranks the run executes, parallel layouts (engine checkpoints load at any
  TP/PP), micro-batching, rollout engine knobs, validation and logging. A field that only
  one side has (a config written by older code) is not compared.
- model: the hashes of the model directory's small files (config.json, tokenizer files,
  ...) and the names and sizes of its weight files. So a model rebuilt or replaced under the
  same path is noticed too (the embedded demo's warm start records its build there).
- data: the content of ``data.train_files`` (`data_fingerprint`: size and SHA-256 of each
  file, of its first and last 32 MiB past 256 MiB), not only their paths: the sampler's state
  indexes the rows, so a file rewritten under the same path would resume on other prompts.

With ``trainer.resume_mode=auto`` a difference is an error naming the checkpoint, the
differences and the fixes (the typical cause: an old output directory, e.g. of the demo
before a change). A checkpoint path given explicitly is the user's choice: the
differences are logged as warnings and the run resumes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from dataclasses import fields
from typing import Any

import yaml

from verl_mp.config.engine import MAY_DIFFER_ON_RESUME, EngineSettings
from verl_mp.config.loader import to_yaml
from verl_mp.trainer.checkpoint_manager import CheckpointManager

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.yaml"
STATE_FILENAME = "trainer_state.json"
FINGERPRINT_KEY = "model_fingerprint"
DATA_FINGERPRINT_KEY = "data_fingerprint"


def engine_keys_that_may_differ() -> tuple[str, ...]:
    """``*.<field>`` (and ``*.<field>.*``) of every `EngineSettings` field marked
    `MAY_DIFFER_ON_RESUME`: layout, memory and speed settings of any engine role."""
    keys = []
    for f in fields(EngineSettings):
        if dict(f.metadata) == MAY_DIFFER_ON_RESUME:
            keys += [f"*.{f.name}", f"*.{f.name}.*"]
    return tuple(keys)


MAY_DIFFER = (
    "trainer.launcher", "trainer.nproc", "trainer.nnodes", "trainer.placement", "trainer.placement.*",
    "trainer.total_steps", "trainer.max_steps_this_run", "trainer.save_freq", "trainer.save_final",
    "trainer.test_freq", "trainer.val_before_train", "trainer.default_local_dir", "trainer.resume_mode",
    "trainer.max_ckpt_to_keep", "trainer.logger", "trainer.project_name", "trainer.experiment_name",
    "trainer.peak_tflops", "trainer.export_hf_at_end", "trainer.gpu_memory_gib",
    "*.megatron", "*.megatron.*", *engine_keys_that_may_differ(),
    "rollout.logprob_gap_freq", "rollout.logprobs_source", "trainer.save_on_interrupt",
    "actor.moe.grouped_gemm", "actor.old_log_probs",  # where the same old log-probs come from
    "rollout.tensor_model_parallel_size", "rollout.gpu_memory_utilization", "rollout.cpu_kv_cache_gb",
    "rollout.enforce_eager", "rollout.cudagraph_max_tokens", "rollout.load_format", "rollout.sleep_level",
    "rollout.keep_weights_on_gpu", "rollout.multi_turn.admit_every_steps",
    "rollout.weight_sync_bucket_mb",
    "rollout.weight_sync_mode",
    "rollout.logprob_diff_threshold", "rollout.val_sampling.*",
    "data.val_files", "data.val_batch_size", "reward.num_workers", "reward.timeout_s",
    "reward.memory_limit_mb", "reward.cpu_limit_s", "reward.max_open_files", "reward.max_processes",
    "reward.max_calls_per_worker", "reward.pass_env", "reward.max_failure_fraction",
    "rollout.multi_turn.tool_num_workers", "rollout.multi_turn.tool_memory_limit_mb",
    "rollout.multi_turn.tool_cpu_limit_s",
)
"""Dotted config keys (fnmatch patterns) that may change between a run and its resume."""

PATH_KEYS = ("model.path", "data.train_files", "reward_model.path")
"""Compared after ``os.path.normpath`` (``/ckpt/m/`` is ``/ckpt/m``)."""

_HASHED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".py")
_HASH_LIMIT_BYTES = 64 << 20
_MAX_LISTED = 12


def model_fingerprint(model_path: str) -> dict[str, str]:
    """File name -> ``sha256:<16 hex>`` for the top-level small files of an HF model
    directory (config, tokenizer, generation config, ...), ``bytes:<N>`` for the others
    (weights: hashing them would take minutes for large models)."""
    if not os.path.isdir(model_path):
        return {}
    out = {}
    for entry in sorted(os.scandir(model_path), key=lambda e: e.name):
        if not entry.is_file():
            continue
        size = entry.stat().st_size
        if entry.name.endswith(_HASHED_SUFFIXES) and size <= _HASH_LIMIT_BYTES:
            with open(entry.path, "rb") as f:
                out[entry.name] = "sha256:" + hashlib.sha256(f.read()).hexdigest()[:16]
        else:
            out[entry.name] = f"bytes:{size}"
    return out


_FULL_HASH_BYTES = 256 << 20
_SAMPLED_BYTES = 32 << 20


def file_fingerprint(path: str) -> str:
    """``bytes:<N> sha256:<16 hex>`` of a file's content (past 256 MiB: of its first and last
    32 MiB, ``sampled-sha256``; a parquet file's footer, with every row group's offsets and
    statistics, is at its end); ``missing`` if there is none."""
    try:
        size = os.path.getsize(path)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            if size <= _FULL_HASH_BYTES:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                kind = "sha256"
            else:
                digest.update(f.read(_SAMPLED_BYTES))
                f.seek(size - _SAMPLED_BYTES)
                digest.update(f.read(_SAMPLED_BYTES))
                kind = "sampled-sha256"
    except OSError:
        return "missing"
    return f"bytes:{size} {kind}:{digest.hexdigest()[:16]}"


def data_fingerprint(train_files: list[str]) -> list[list[str]]:
    """``[path, file_fingerprint]`` of each training file, in order (rows are numbered across
    the files in this order)."""
    return [[path, file_fingerprint(path)] for path in train_files]


def data_differences(saved: list, current: list) -> list[str]:
    """The training files whose content differs from the checkpoint's (by position)."""
    if [fp for _, fp in saved] == [fp for _, fp in current]:
        return []
    if len(saved) != len(current):
        return [f"data.train_files: {len(saved)} file(s) when the checkpoint was written, {len(current)} now"]
    return [f"data.train_files: the content of {now_path} is not the content the checkpoint was trained on "
            f"({old_fp} then, {now_fp} now)"
            for (_, old_fp), (now_path, now_fp) in zip(saved, current, strict=True) if old_fp != now_fp]


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> ``{"a.b.c": leaf}``; lists and scalars are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _normalised(key: str, value: Any) -> Any:
    if key in PATH_KEYS:
        if isinstance(value, str):
            return os.path.normpath(value) if value else value
        if isinstance(value, list):
            return [os.path.normpath(v) if isinstance(v, str) else v for v in value]
    return value


def config_differences(saved: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for each compared field that differs."""
    saved_flat, current_flat = flatten(saved), flatten(current)
    diffs = []
    for key in sorted(saved_flat.keys() & current_flat.keys()):
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_DIFFER):
            continue
        a, b = _normalised(key, saved_flat[key]), _normalised(key, current_flat[key])
        if a != b:
            diffs.append((key, saved_flat[key], current_flat[key]))
    return diffs


def fingerprint_differences(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """File names of the model directory that were added, removed or changed."""
    names = saved.keys() | current.keys()
    return sorted(name for name in names if saved.get(name) != current.get(name))


def resume_differences(checkpoint_path: str, current_config: dict,
                       current_fingerprint: dict[str, str], current_data: list | None = None) -> list[str]:
    """Human-readable differences between the run that wrote ``checkpoint_path`` and this one
    (``current_data``: `data_fingerprint` of this run's training files, None: not compared)."""
    config_path = os.path.join(checkpoint_path, CONFIG_FILENAME)
    if not os.path.isfile(config_path):
        return [f"the checkpoint has no {CONFIG_FILENAME}, so it cannot be matched to this run"]
    with open(config_path, encoding="utf-8") as f:
        saved_config = yaml.safe_load(f) or {}
    lines = []
    state_path = os.path.join(checkpoint_path, STATE_FILENAME)
    saved_state = {}
    if os.path.isfile(state_path):
        with open(state_path, encoding="utf-8") as f:
            saved_state = json.load(f)
    saved_fingerprint, saved_data = saved_state.get(FINGERPRINT_KEY), saved_state.get(DATA_FINGERPRINT_KEY)
    if saved_data is not None and current_data is not None:  # checkpoints of older code have none
        lines += data_differences(saved_data, current_data)
    if saved_fingerprint is not None:  # checkpoints of older code have none
        changed = fingerprint_differences(saved_fingerprint, current_fingerprint)
        if changed:
            lines.append("the model directory (model.path) is not the one the checkpoint was "
                         f"trained from: {', '.join(changed)} differ")
    lines += [f"{key}: {a!r} in the checkpoint, {b!r} now"
              for key, a, b in config_differences(saved_config, current_config)]
    return lines


def run_config(cfg) -> dict:
    """The resolved config as the dict that ``config.yaml`` holds."""
    return yaml.safe_load(to_yaml(cfg))


def check_resume(checkpoint_path: str, cfg, explicit: bool) -> None:
    """Raise ``ValueError`` (auto-resume) or warn (``explicit``: the path was given) if a
    different run than ``cfg`` (a RootConfig) wrote ``checkpoint_path``."""
    lines = resume_differences(checkpoint_path, run_config(cfg), model_fingerprint(cfg.model.path),
                               data_fingerprint(cfg.data.train_files))
    if not lines:
        return
    if len(lines) > _MAX_LISTED:
        lines = lines[:_MAX_LISTED] + [f"... and {len(lines) - _MAX_LISTED} more"]
    details = "\n  - ".join(lines)
    if explicit:
        logger.warning("resuming %s although it was written by a different run:\n  - %s",
                       checkpoint_path, details)
        return
    out_dir = os.path.dirname(os.path.dirname(os.path.abspath(checkpoint_path)))
    raise ValueError(
        f"trainer.resume_mode=auto: the newest checkpoint {checkpoint_path} was written by a "
        f"different run than this one:\n  - {details}\n"
        f"Fix: write this run elsewhere with a new trainer.default_local_dir (now {out_dir}), "
        "or start over in the same directory with trainer.resume_mode=disable, or resume that "
        f"checkpoint anyway with trainer.resume_mode={checkpoint_path}."
    )


def preflight_resume(cfg) -> None:
    """Before any process starts: with ``trainer.resume_mode=auto``, fail early if the
    newest checkpoint under ``trainer.default_local_dir`` belongs to a different run."""
    if cfg.trainer.resume_mode == "disable":
        return
    # rank=1: a read-only view (only rank 0 creates or cleans the directory)
    root = os.path.join(cfg.trainer.default_local_dir, "checkpoints")
    manager = CheckpointManager(root, rank=1)
    if cfg.trainer.resume_mode != "auto":
        manager.resolve_resume(cfg.trainer.resume_mode)  # a path: must be a complete checkpoint
        return  # (the trainer warns if another run wrote it)
    found = manager.latest()
    if found is not None:
        check_resume(found[1], cfg, explicit=False)
