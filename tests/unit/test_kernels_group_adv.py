"""Group-advantage kernel (GRPO / Dr.GRPO / RLOO) vs the torch reference, ragged groups."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.algo import ADVANTAGE_ESTIMATORS, group_outcome_torch  # noqa: E402
from verl_mp.kernels import group_advantages_triton  # noqa: E402
from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not triton_available() or not (DEVICE == "cuda" or interpreter_ready()),
        reason="needs CUDA, or TRITON_INTERPRET=1 before triton's import (test_kernels_fresh_process)",
    ),
    pytest.mark.filterwarnings("ignore:a group has a single sample"),
]
# Kernel and reference both read the (bf16 or fp32) inputs and compute in fp32: they differ
# only in fp32 rounding order (measured <= 4.8e-7 on values up to 5), whatever the input dtype.
TOL = 1e-5


def ragged_groups(num_rows, num_steps, num_ids, dtype=torch.float32, seed=0):
    """Shuffled group ids (some groups of one), right-padded masks with empty rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_ids, (num_rows,), generator=g) * 1000 - 7  # arbitrary int64 ids
    ids[num_rows // 2] = 2**40  # a group of one
    lengths = torch.randint(0, num_steps + 1, (num_rows,), generator=g)
    mask = torch.arange(num_steps)[None, :] < lengths[:, None]
    rewards = (torch.rand(num_rows, num_steps, generator=g) < 0.3).float() * torch.randn(
        num_rows, num_steps, generator=g
    )
    return rewards.to(dtype).to(DEVICE), mask.to(DEVICE), ids.to(DEVICE)


@pytest.mark.parametrize("mode", ["std", "mean", "rloo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_group_kernel_matches_reference(mode, dtype):
    rewards, mask, ids = ragged_groups(37, 9, 8, dtype)  # 37 rows: three BLOCK_N chunks
    adv, scores, sizes = group_advantages_triton(rewards, mask, ids, mode)
    ref_adv, ref_scores, ref_sizes = group_outcome_torch(rewards, mask, ids, mode)
    assert (sizes == ref_sizes).all() and (sizes == 1).any()
    torch.testing.assert_close(scores, ref_scores, atol=TOL, rtol=0)
    torch.testing.assert_close(adv, ref_adv, atol=TOL, rtol=0)
    assert (adv[~mask] == 0).all() and (adv[sizes == 1] == 0).all()


def test_group_kernel_equal_rewards_exact_zero():
    rewards = torch.full((6, 5), 0.1, device=DEVICE)
    mask = torch.ones(6, 5, dtype=torch.bool, device=DEVICE)
    ids = torch.tensor([4, 9, 4, 9, 4, 9], device=DEVICE)
    for mode in ("std", "mean", "rloo"):
        adv, _, _ = group_advantages_triton(rewards, mask, ids, mode)
        assert (adv == 0).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_estimators_use_kernel(name):
    rewards, mask, ids = ragged_groups(12, 6, 4, seed=2)
    fn = ADVANTAGE_ESTIMATORS[name]
    got, _ = fn(rewards, mask, ids, impl="triton")
    want, _ = fn(rewards, mask, ids, impl="torch")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_group_launcher_checks():
    rewards, mask, ids = ragged_groups(4, 3, 2)
    with pytest.raises(ValueError, match="dtype"):
        group_advantages_triton(rewards, mask, ids.int(), "std")
    with pytest.raises(ValueError, match="shape"):
        group_advantages_triton(rewards, mask, ids[:3].contiguous(), "std")
    with pytest.raises(ValueError, match="mode"):
        group_advantages_triton(rewards, mask, ids, "median")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_group_kernel_large_gpu():
    rewards, mask, ids = ragged_groups(1024, 2048, 100, seed=4)
    for mode in ("std", "rloo"):
        adv, _, _ = group_advantages_triton(rewards, mask, ids, mode)
        ref, _, _ = group_outcome_torch(rewards, mask, ids, mode)
        torch.testing.assert_close(adv, ref, atol=1e-4, rtol=1e-5)
