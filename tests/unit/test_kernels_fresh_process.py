"""Runs the CPU kernel tests in a fresh process when this one cannot interpret Triton.

Triton fixes the mode of its own helpers when `triton.language` is first imported. If
another test module imported triton (e.g. through transformers) during collection before
TRITON_INTERPRET=1 was set, the kernel tests skip themselves in this process, and this test
re-runs them in a subprocess with the variable set from the start.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402

pytestmark = pytest.mark.unit
HERE = Path(__file__).resolve().parent
KERNEL_TESTS = [
    "test_kernels_gae.py",
    "test_kernels_group_adv.py",
    "test_kernels_layers.py",
    "test_kernels_logprob.py",
    "test_models_engine_logprobs.py",
]


@pytest.mark.skipif(
    torch.cuda.is_available() or not triton_available() or interpreter_ready(),
    reason="the kernel tests run in this process",
)
def test_kernel_tests_in_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    files = [str(HERE / f) for f in KERNEL_TESTS]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", *files]
    proc = subprocess.run(
        cmd, env=env, cwd=HERE.parent.parent, capture_output=True, text=True, timeout=600
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "passed" in summary and "skipped" not in summary, proc.stdout[-2000:]
