"""Run megatron-core on a machine without CUDA (gloo, fp32/bf16 on CPU).

Upstream: megatron-core 0.16.1 (also seen in 0.13-0.15). megatron-core is written for
CUDA: it allocates buffers with ``device=torch.cuda.current_device()`` or
``device='cuda'`` (``_ParamAndGradBuffer``, ``GlobalMemoryBuffer``, ``MegatronOptimizer``,
``clip_grads``), checks ``param.type() == 'torch.cuda.FloatTensor'`` in the (distributed)
optimizer, creates CUDA streams/events around grad reduction, and keeps the tensor-parallel
RNG in CUDA generators. On a CPU-only torch build each of these raises.

What this shim does, only when ``torch.cuda.is_available()`` is False:

1. ``install()`` replaces the torch.cuda functions that would raise on a CPU build
   (``current_device``, streams, events, ``synchronize``, the CUDA RNG accessors) with
   CPU equivalents: streams and events are no-ops (CPU ops are synchronous), the "device
   RNG" is the CPU default generator, and ``current_device()`` returns the CPU device. Functions that
   already work on a CPU build (``is_available``, ``device_count``) are left alone.
2. ``megatron_scope()`` is a ``TorchFunctionMode`` the engine enters around its megatron
   calls: inside it, tensors requested on ``cuda`` are created on ``cpu``,
   ``Tensor.cuda()`` returns the tensor itself, and ``Tensor.type()`` reports the CUDA
   type name that megatron's optimizer checks for. Outside the scope nothing changes, so
   vLLM and transformers in the same process never see it.

3. The local attention's causal masks (``get_default_causal_mask``,
   ``get_sliding_window_causal_mask``) are rebuilt on the CPU: activation recompute calls
   them inside backward, outside the scope.

Nothing here changes numerics: every op still runs the same torch kernel on the same
data; only the device placement and CUDA bookkeeping are redirected.

Remove when megatron-core supports a device-agnostic (CPU) backend upstream.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_INSTALLED = False
_LOCK = threading.Lock()


class _NullStream:
    """A CUDA stream stand-in: CPU kernels run synchronously, so waiting is a no-op."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else _NullEvent()

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NullEvent:
    """A CUDA event stand-in; elapsed times are not measured on CPU."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


_NULL_STREAM = _NullStream()


def _cpu_rng_get(device=None):
    return torch.get_rng_state()


def _cpu_rng_set(new_state, device=None):
    torch.set_rng_state(new_state)


def _cpu_manual_seed(seed):
    # torch.manual_seed() itself calls torch.cuda.manual_seed_all(); seed the CPU
    # generator directly to avoid recursing through this replacement.
    torch.default_generator.manual_seed(int(seed))


def _megatron_set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def _megatron_get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = torch.get_rng_state()
    return state.clone() if clone else state


_CUDA_REPLACEMENTS = {
    # A device object, not the usual int: megatron allocates with
    # device=torch.cuda.current_device() also inside autograd backward (sequence-parallel
    # gathers), where megatron_scope's mode is not active; "cpu" is right in both places.
    "current_device": lambda: torch.device("cpu"),
    "set_device": lambda device: None,
    "synchronize": lambda device=None: None,
    "empty_cache": lambda: None,
    "Stream": _NullStream,
    "Event": _NullEvent,
    "current_stream": lambda device=None: _NULL_STREAM,
    "default_stream": lambda device=None: _NULL_STREAM,
    "stream": lambda stream=None: contextlib.nullcontext(),
    "set_stream": lambda stream: None,
    "get_rng_state": _cpu_rng_get,
    "set_rng_state": _cpu_rng_set,
    "manual_seed": _cpu_manual_seed,
    "manual_seed_all": lambda seed: None,  # torch.manual_seed already seeded the CPU
}


def cuda_available() -> bool:
    return torch.cuda.is_available()


def install() -> bool:
    """Install the torch.cuda replacements if CUDA is absent. Idempotent.

    Returns True when the shim is (now) active, False on a CUDA machine, where it
    changes nothing at all.
    """
    global _INSTALLED
    if cuda_available():
        return False
    with _LOCK:
        if _INSTALLED:
            return True
        for name, fn in _CUDA_REPLACEMENTS.items():
            setattr(torch.cuda, name, fn)
        torch.cuda.random.get_rng_state = _cpu_rng_get
        torch.cuda.random.set_rng_state = _cpu_rng_set
        _patch_megatron_rng()
        _patch_megatron_masks()
        _INSTALLED = True
    return True


def _patch_megatron_rng() -> None:
    """megatron's RNG tracker reads CUDA generators directly (``_set_cuda_rng_state``)."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._set_cuda_rng_state = _megatron_set_rng_state
    mrandom._get_cuda_rng_state = _megatron_get_rng_state


def _patch_megatron_masks() -> None:
    """The local attention's causal masks are built with ``device="cuda"`` on every call,
    also when activation recompute re-runs the forward inside backward, where the
    ``megatron_scope`` mode is not active (autograd calls the recompute outside it)."""
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils

    def causal(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()

    def sliding(sq, skv, window_size):
        m = torch.ones(sq, skv, dtype=torch.bool, device="cpu")
        return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])

    for module in (utils, fused_softmax):
        module.get_default_causal_mask = causal
        module.get_sliding_window_causal_mask = sliding


def _is_cuda_device(device) -> bool:
    if isinstance(device, int):
        return True  # megatron passes torch.cuda.current_device() (an int) as a device
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
}


class _CpuDeviceMode(TorchFunctionMode):
    """Redirects CUDA placement to CPU for the calls made inside ``megatron_scope``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = _CUDA_TYPE_NAMES.get(args[0].dtype)
            if name is not None:
                return name
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.to and args and _is_cuda_device_arg(args[1:]):
            args = (args[0], "cpu") + tuple(args[2:])
        return func(*args, **kwargs)


def _is_cuda_device_arg(rest) -> bool:
    return bool(rest) and isinstance(rest[0], str | torch.device) and _is_cuda_device(rest[0])


@contextlib.contextmanager
def megatron_scope():
    """Context for megatron calls: a no-op with CUDA, the CPU redirection without it."""
    if cuda_available():
        yield
        return
    install()
    with _CpuDeviceMode():
        yield
