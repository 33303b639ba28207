"""`verl_mp.utils.profiling`: what a profiled step writes and how kernels are sorted by kind.

The whole path (the driver opening a session on every worker group around a step, under
Ray and torchrun) runs in tests/e2e/test_train_cli.py::test_grpo.
"""

import gzip
import json

import pytest
import torch

from verl_mp.config.profile import ProfileConfig
from verl_mp.utils.profiling import StepProfiler, kernel_kind, phase

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name,kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "nccl"),
    ("logprob_fwd_kernel", "verl_mp"),
    ("triton_poi_fused_add_mul_0", "triton"),
    ("fused_moe_kernel", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("Memcpy HtoD (Pageable -> Device)", "copy"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_kinds(name, kind):
    assert kernel_kind(name) == kind


def test_a_session_writes_the_table_the_phases_and_the_trace(tmp_path):
    prof = StepProfiler()
    prof.start(str(tmp_path), "g_rank0", ProfileConfig())
    with pytest.raises(RuntimeError, match="already open"):
        prof.start(str(tmp_path), "g_rank0", ProfileConfig())
    a = torch.randn(256, 256)
    for _ in range(2):
        with phase("update"):
            (a @ a).sum()
    with phase("generate"):
        torch.softmax(a, -1)
    summary = prof.stop()
    assert not prof.active and prof.stop() is None
    assert summary["phases"]["update"]["calls"] == 2 and summary["phases"]["generate"]["calls"] == 1
    assert summary["phases"]["update"]["cpu_ms"] > 0
    assert json.loads((tmp_path / "g_rank0_phases.json").read_text()) == summary
    assert "aten::mm" in (tmp_path / "g_rank0.txt").read_text()
    trace = json.loads(gzip.open(tmp_path / "g_rank0.trace.json.gz").read())
    assert any(e.get("name") == "verl_mp/update" for e in trace["traceEvents"])
    assert not (tmp_path / "g_rank0.trace.json").exists()


@pytest.mark.parametrize("field,value", [("steps", [0]), ("ranks", [-1]), ("top", 0)])
def test_bad_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=f"trainer.profile.{field}"):
        ProfileConfig(**{field: value})


def _python_work(n: int) -> int:
    return sum(i * i for i in range(n))


def test_host_profile_ranks_the_steps_python_functions(tmp_path):
    prof = StepProfiler()
    prof.start(str(tmp_path), "g_rank0", ProfileConfig(host=True, trace=False, top=10))
    for _ in range(3):
        _python_work(20_000)
    prof.stop()
    table = (tmp_path / "g_rank0_host.txt").read_text()
    assert table.count("Ordered by: internal time") == 1 and table.count("Ordered by: cumulative time") == 1
    assert "_python_work" in table  # the function the step ran, named in the host table
    assert "3    " in table.split("_python_work")[0].rsplit("\n", 1)[-1]  # called 3 times
    assert not (tmp_path / "g_rank0.trace.json.gz").exists()
    # without host: no host table
    prof.start(str(tmp_path / "plain"), "g_rank0", ProfileConfig(trace=False))
    prof.stop()
    assert not (tmp_path / "plain" / "g_rank0_host.txt").exists()


def test_host_alone_writes_only_the_host_table(tmp_path):
    prof = StepProfiler()
    prof.start(str(tmp_path), "g_rank0", ProfileConfig(ops=False, host=True))
    assert prof.active
    with phase("generate"):
        _python_work(10_000)
    assert prof.stop() is None and not prof.active  # no torch.profiler: no phases summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g_rank0_host.txt"]
    assert "_python_work" in (tmp_path / "g_rank0_host.txt").read_text()


@pytest.mark.parametrize("settings,match", [
    (dict(ops=False), "records nothing"),
    (dict(host=True, with_stack=True), "both hook Python's profiler"),
])
def test_profiling_nothing_or_twice_is_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        ProfileConfig(**settings)
