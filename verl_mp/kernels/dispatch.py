"""The switch between Triton kernels and their pure-torch references, and launcher checks.

Selection, first match wins:
1. the ``impl=`` argument of a kernel entry point (``"torch"``, ``"triton"`` or ``"auto"``),
   which the trainer fills from its config;
2. the environment variable ``VERL_MP_KERNELS`` (same values);
3. ``"auto"``: Triton for CUDA tensors when Triton is installed, torch otherwise.

Triton on CPU tensors runs only in interpreter mode (``TRITON_INTERPRET=1`` set before
triton is first imported); that is how the unit tests exercise the kernels without a
GPU. Asking for ``"triton"`` on CPU without it is an error, never a silent fallback.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter
from collections.abc import Sequence

import torch

ENV_VAR = "VERL_MP_KERNELS"
IMPLS = ("auto", "torch", "triton")

TRITON_LAUNCHES: Counter[str] = Counter()
"""Triton kernel launches in this process, by kernel name (every launcher counts its own
with `count_launch`): which path really ran, e.g. in the engine under ``VERL_MP_KERNELS``.
One dictionary update per launch."""


def count_launch(kernel: str) -> None:
    TRITON_LAUNCHES[kernel] += 1


def triton_available() -> bool:
    """Whether the `triton` package can be imported (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpret_mode() -> bool:
    """Whether Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def interpreter_ready() -> bool:
    """Whether Triton kernels can run on CPU tensors in this process.

    Needs ``TRITON_INTERPRET=1`` set before `triton.language` is first imported: Triton
    fixes the mode of its own helpers (``tl.zeros``, ``tl.sum``, ...) at import time.
    """
    if not interpret_mode() or not triton_available():
        return False
    if "triton.language" not in sys.modules:
        return True
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def select_impl(impl: str | None, device: torch.device) -> str:
    """Resolve the implementation for tensors on `device`: returns "torch" or "triton"."""
    choice = impl if impl is not None else os.environ.get(ENV_VAR, "auto")
    choice = choice.strip().lower()
    if choice not in IMPLS:
        raise ValueError(f"kernel impl {choice!r} (argument or ${ENV_VAR}) must be one of {IMPLS}")
    if choice == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if choice == "triton":
        if not triton_available():
            raise ValueError(
                f"impl='triton' but triton is not installed; use impl='torch' or {ENV_VAR}=torch"
            )
        if device.type != "cuda" and not interpreter_ready():
            raise ValueError(
                f"impl='triton' on a {device.type} tensor needs TRITON_INTERPRET=1 set before triton "
                f"is first imported; otherwise use impl='torch' or {ENV_VAR}=torch"
            )
    return choice


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    shape: Sequence[int] | None = None,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
) -> None:
    """Raise a `ValueError` naming `name` unless `t` is contiguous and matches the spec."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {names}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous (call .contiguous() first); strides {t.stride()}"
        )


FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64) + FLOAT_DTYPES


def mask_for_kernel(mask: torch.Tensor) -> torch.Tensor:
    """Bool masks are passed to Triton as uint8 views (no copy)."""
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)
