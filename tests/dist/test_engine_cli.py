"""The real ``verify`` and ``convert`` subcommands (they start their own torchrun ranks)."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from verl_mp.demo.tiny_models import build_tiny_checkpoint

pytestmark = pytest.mark.dist


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_mp", *map(str, args)],
                          capture_output=True, text=True, timeout=400)


def tensors(path) -> dict:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.mark.smoke  # engine vs HF transformers, in README's fast test command
def test_verify_prints_one_json_line_and_passes(tmp_path):
    # One rank keeps CI short: every layout runs the same functions in test_engine_hf.py.
    model = build_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    proc = cli("verify", "--model", model, "--tp", 1, "--pp", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["passed"] and line["max_abs_diff"] <= line["tol"] == 1e-4
    assert (line["tp"], line["pp"], line["arch"]) == (1, 1, "Qwen3ForCausalLM")


def test_convert_hf_to_megatron_tp2_and_back_at_pp2_is_bitwise(tmp_path):
    model = build_tiny_checkpoint("qwen2", tmp_path / "qwen2")  # tied, QKV bias, vocab 97
    ckpt, back = tmp_path / "mcore", tmp_path / "back"
    first = cli("convert", "hf-to-megatron", "--src", model, "--out", ckpt, "--tp", 2)
    assert first.returncode == 0, first.stderr[-3000:]
    second = cli("convert", "megatron-to-hf", "--src", ckpt, "--out", back, "--pp", 2)
    assert second.returncode == 0, second.stderr[-3000:]
    original, converted = tensors(model), tensors(back)
    assert converted.keys() == original.keys()
    assert all(torch.equal(converted[k], v) and converted[k].dtype == v.dtype for k, v in original.items())
    assert json.loads((back / "config.json").read_text()) == json.loads((model / "config.json").read_text())
