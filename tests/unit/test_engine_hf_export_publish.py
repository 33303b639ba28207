"""An HF export replaces the previous one all at once, also when it dies at any rename.

The rank-0 tail of `export_hf_weights` (`publish_export`: shard renames and index inside the
staging dir, then the publication) runs here on shards written the way the export's writers
write them, with ``os.replace`` failing at each of its calls in turn. Whatever step fails,
transformers loads from ``hf/`` either the whole previous export or the whole new one (or
finds no ``hf/`` while the previous one waits to be restored), and the next export cleans up.
The code before this change wrote into ``hf/`` in place: the stale single ``model.safetensors``
of the previous export stayed beside the new shards and transformers loaded it.
"""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_mp.demo.tiny_models import build_tiny_checkpoint
from verl_mp.engine import hf_weights
from verl_mp.models.hf_checkpoint import open_hf_checkpoint

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    old = build_tiny_checkpoint("qwen2", root / "old", seed=0, shard_kb=None)  # one model.safetensors
    new = build_tiny_checkpoint("qwen2", root / "new", seed=1, shard_kb=40)
    return old, new


def state_of(path) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).state_dict()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def write_new_export(out, new):
    """What the writers do: shards of the new weights in the staging dir; their file list."""
    staging = hf_weights.prepare_staging(out)
    tensors = {}
    for file in sorted(new.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    names = sorted(tensors)
    files = []
    for k, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        name = f"_stage000-{k:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(staging / name), metadata={"format": "pt"})
        files.append((name, part, sum(tensors[n].numel() * 4 for n in part)))
    return files


def publish(out, new, files):
    spec = open_hf_checkpoint(new).spec
    hf_weights.publish_export(out, files, spec, torch.float32, new)


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])  # 2 shard renames, then out->replaced, staging->out
def test_export_interrupted_at_every_rename(models, tmp_path, monkeypatch, fail_at):
    old, new = models
    out = tmp_path / "hf"
    shutil.copytree(old, out)  # the previous export
    files = write_new_export(out, new)
    calls, real_replace = [0], os.replace

    def failing_replace(src, dst):
        calls[0] += 1
        if calls[0] == fail_at:
            raise OSError("killed here")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="killed here"):
        publish(out, new, files)
    monkeypatch.setattr(os, "replace", real_replace)

    old_state, new_state = state_of(old), state_of(new)
    if out.exists():
        assert same(state_of(out), old_state if fail_at <= 3 else new_state)
    else:  # between the two renames: the previous export waits aside, complete
        assert fail_at == 4 and same(state_of(tmp_path / ".hf.replaced"), old_state)
    files = write_new_export(out, new)  # the next export: restores, then starts afresh
    assert same(state_of(out), old_state)
    publish(out, new, files)
    assert same(state_of(out), new_state)
    assert not (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or replaced copy left
