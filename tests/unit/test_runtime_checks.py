"""Foundation checks: bad layouts and rank counts stop before any process starts, and
the CPU shim is inert on CUDA machines and outside megatron calls."""

import subprocess
import sys

import pytest
import torch

from verl_mp.config.parallel import ModelShape, ParallelConfig, validate_layout
from verl_mp.utils import launch

pytestmark = pytest.mark.unit

SHAPE = ModelShape(num_layers=4, num_attention_heads=4, num_query_groups=2, vocab_size=100)


@pytest.fixture
def no_spawn(monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("a process was started despite invalid input")

    monkeypatch.setattr(launch.subprocess, "Popen", forbidden)


def test_too_many_ranks_refused_before_start(no_spawn, monkeypatch):
    monkeypatch.setenv("VERL_MP_MAX_CPU_RANKS", "4")
    with pytest.raises(ValueError, match=r"nproc=5 asks for more ranks .*VERL_MP_MAX_CPU_RANKS"):
        launch.launch_local("verl_mp.cli", 5)


def test_tp_not_dividing_heads_refused_before_start(no_spawn):
    bad = ParallelConfig(tensor_model_parallel_size=3)
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=3 must divide num_attention_heads=4"):
        launch.launch_local("verl_mp.cli", 3, preflight=[lambda: validate_layout(bad, 3, SHAPE, "actor.")])


@pytest.mark.parametrize(
    "cfg,world,msg",
    [
        (dict(tensor_model_parallel_size=4), 4, r"must divide the KV heads \(num_key_value_heads=2\)"),
        (dict(pipeline_model_parallel_size=3), 3, r"num_layers=4 is not divisible"),
        (dict(tensor_model_parallel_size=2), 3, r"world size 3 is not divisible"),
        (dict(sequence_parallel=True), 1, r"sequence_parallel=True needs"),
        (dict(virtual_pipeline_model_parallel_size=2), 1, r"needs pipeline_model_parallel_size > 1"),
        (dict(tensor_model_parallel_size=0), 1, r"must be a positive integer"),
    ],
)
def test_layout_errors_name_the_setting(cfg, world, msg):
    with pytest.raises(ValueError, match=msg):
        validate_layout(ParallelConfig(**cfg), world, SHAPE)


MOE = ModelShape(num_layers=4, num_attention_heads=4, num_query_groups=2, vocab_size=100, num_experts=6,
                 moe_ffn_hidden_size=30)


@pytest.mark.parametrize(
    "cfg,world,shape,msg",
    [
        (dict(expert_model_parallel_size=2), 2, SHAPE, r"expert_model_parallel_size=2 needs a mixture-of-experts"),
        (dict(expert_model_parallel_size=4), 4, MOE, r"expert_model_parallel_size=4 must divide the number of experts \(6\)"),
        (dict(expert_model_parallel_size=2, expert_tensor_parallel_size=4), 8, MOE,
         r"expert_tensor_parallel_size=4 must divide the expert intermediate size \(30\)"),
        (dict(expert_model_parallel_size=3, pipeline_model_parallel_size=2), 4, MOE,
         r"world size 4 is not divisible by actor.expert_tensor_parallel_size=1 x actor.expert_model_parallel_size=3"),
        (dict(expert_model_parallel_size=0), 1, MOE, r"actor.expert_model_parallel_size=0 must be a positive"),
        (dict(tensor_model_parallel_size=2, expert_model_parallel_size=2), 4, MOE,
         r"at actor.tensor_model_parallel_size=2 needs actor.sequence_parallel=true"),
        (dict(expert_tensor_parallel_size=2), 2, MOE, r"at actor.expert_model_parallel_size=1; megatron"),
    ],
)
def test_expert_layout_errors_name_the_setting(cfg, world, shape, msg):
    with pytest.raises(ValueError, match=msg):
        validate_layout(ParallelConfig(**cfg), world, shape, "actor.")


def test_valid_expert_layouts():
    # TP2 x EP2 with expert-TP 1 on 2 ranks: the EP group is the TP group
    cfg = ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=2, expert_tensor_parallel_size=1,
                         sequence_parallel=True)
    assert validate_layout(cfg, 2, MOE) == 1
    # forward-only engines need no sequence parallelism
    assert validate_layout(ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=2), 4, MOE,
                           trainable=False) == 2


def test_valid_layout_returns_dp_size():
    cfg = ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert validate_layout(cfg, 8, SHAPE) == 2


_PROBE = """
import torch, megatron.core.tensor_parallel.random as r
before = (torch.cuda.current_device, torch.cuda.Stream, torch.cuda.synchronize,
          torch.cuda.get_rng_state, r._set_cuda_rng_state, r._get_cuda_rng_state)
import verl_mp, verl_mp.cli, verl_mp.engine.runtime, verl_mp.engine.model, verl_mp.engine.schedule
after = (torch.cuda.current_device, torch.cuda.Stream, torch.cuda.synchronize,
         torch.cuda.get_rng_state, r._set_cuda_rng_state, r._get_cuda_rng_state)
assert all(a is b for a, b in zip(before, after)), "importing verl_mp patched torch/megatron"
print("unchanged")
"""


def test_import_changes_nothing():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unchanged" in out.stdout


def test_shim_inert_when_cuda_present(monkeypatch):
    from verl_mp.patches import megatron_cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(megatron_cpu, "_INSTALLED", False)
    before = torch.cuda.current_device
    assert megatron_cpu.install() is False
    with megatron_cpu.megatron_scope():
        assert torch.ones(1).type() == "torch.FloatTensor"
    assert torch.cuda.current_device is before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU redirection")
def test_scope_redirects_only_inside():
    from verl_mp.patches import megatron_cpu

    with megatron_cpu.megatron_scope():
        t = torch.zeros(2, device="cuda")
        assert t.device.type == "cpu" and t.type() == "torch.cuda.FloatTensor"
        assert torch.empty(1, device=torch.cuda.current_device()).device.type == "cpu"
    assert torch.zeros(2).type() == "torch.FloatTensor"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")
