"""GAE kernel vs the torch reference on random ragged inputs (CPU: TRITON_INTERPRET=1).

bf16 inputs are held to the fp32 tolerance: both sides compute in fp32 from the same values.
Shown to catch what the former bf16 tolerance (1e-2) let through: a kernel that carries its
tile-to-tile state in the input dtype (``carry_lg`` rounded to bf16) fails the 3 bf16 cases.

The kernels are imported lazily at first launch, and Triton reads TRITON_INTERPRET when a
kernel is decorated, so setting it here (at collection, before any test runs) is enough.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.algo import ADVANTAGE_ESTIMATORS, gae_scan_torch  # noqa: E402
from verl_mp.kernels import gae_triton, select_impl  # noqa: E402
from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not triton_available() or not (DEVICE == "cuda" or interpreter_ready()),
        reason="needs CUDA, or TRITON_INTERPRET=1 before triton's import (test_kernels_fresh_process)",
    ),
]
# Kernel and reference both read the (bf16 or fp32) inputs and compute in fp32: they differ
# only in fp32 rounding order (measured <= 4.8e-7 on values up to 5), whatever the input dtype.
TOL = 1e-5


def ragged_inputs(
    num_rows, num_steps, dtype=torch.float32, mask_dtype=torch.bool, seed=0, holes=True
):
    """Right-padded responses of random length (some empty), optionally with holes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, num_steps + 1, (num_rows,), generator=g)
    lengths[0] = num_steps
    mask = torch.arange(num_steps)[None, :] < lengths[:, None]
    if holes:
        mask &= torch.rand(num_rows, num_steps, generator=g) > 0.2
    rewards = torch.randn(num_rows, num_steps, generator=g).to(dtype)
    values = torch.randn(num_rows, num_steps, generator=g).to(dtype)
    return rewards.to(DEVICE), values.to(DEVICE), mask.to(mask_dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
def test_gae_kernel_matches_reference(dtype, mask_dtype):
    rewards, values, mask = ragged_inputs(5, 37, dtype, mask_dtype)
    ref_adv, ref_ret = gae_scan_torch(rewards, values, mask, 0.99, 0.95)
    # BLOCK_T=16: three tiles per row, so the state is carried across tiles.
    adv, ret = gae_triton(rewards, values, mask, 0.99, 0.95, block_b=2, block_t=16)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    torch.testing.assert_close(adv, ref_adv, atol=TOL, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=TOL, rtol=0)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


@pytest.mark.parametrize("shape", [(1, 1), (3, 64), (7, 20)])
def test_gae_kernel_default_config(shape):
    rewards, values, mask = ragged_inputs(*shape, seed=3)
    ref = gae_scan_torch(rewards, values, mask, 1.0, 1.0)
    out = gae_triton(rewards, values, mask, 1.0, 1.0)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_estimators_use_kernel():
    rewards, values, mask = ragged_inputs(4, 24, seed=5, holes=False)
    for name, args in [("gae", (values, mask, 0.9, 0.7)), ("reinforce_plus_plus", (mask, 0.9))]:
        fn = ADVANTAGE_ESTIMATORS[name]
        for got, want in zip(
            fn(rewards, *args, impl="triton"), fn(rewards, *args, impl="torch"), strict=True
        ):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_gae_launcher_checks():
    rewards, values, mask = ragged_inputs(3, 8)
    with pytest.raises(ValueError, match="contiguous"):
        gae_triton(rewards.t(), values.t(), mask.t(), 1.0, 1.0)
    with pytest.raises(ValueError, match="dtype"):
        gae_triton(rewards.long(), values, mask, 1.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        gae_triton(rewards, values[:, :4].contiguous(), mask, 1.0, 1.0)


def test_select_impl(monkeypatch):
    monkeypatch.delenv("VERL_MP_KERNELS", raising=False)
    assert select_impl(None, torch.device("cpu")) == "torch"
    assert select_impl("torch", torch.device("cuda")) == "torch"
    monkeypatch.setenv("VERL_MP_KERNELS", "triton")
    assert select_impl(None, torch.device("cuda")) == "triton"
    assert select_impl("torch", torch.device("cpu")) == "torch"  # argument beats env
    with pytest.raises(ValueError, match="must be one of"):
        select_impl("cuda", torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select_impl("triton", torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gae_kernel_large_gpu():
    rewards, values, mask = ragged_inputs(64, 3000, seed=7)
    out = gae_triton(rewards, values, mask, 0.999, 0.95)
    ref = gae_scan_torch(rewards, values, mask, 0.999, 0.95)  # fp32, one step at a time
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
