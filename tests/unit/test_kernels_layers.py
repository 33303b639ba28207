"""Fused RMSNorm and SwiGLU (`verl_mp.kernels.layers`) vs an fp64 computation of the same math.

Both implementations (the torch reference and the Triton kernels, on CUDA or in the CPU
interpreter) are compared with the reference formula evaluated in fp64 from the same
inputs: outputs and the gradients of a random linear functional of them (dx, and dw for
the norm). fp32 agrees to fp32 rounding; bf16 to a few bf16 ulps of the values' scale (the
Triton path rounds once, the torch path after every op).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verl_mp.kernels.dispatch import interpreter_ready, triton_available  # noqa: E402
from verl_mp.kernels.layers import SwiGLU, rms_norm, rms_norm_torch, swiglu, swiglu_torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAVE_TRITON = triton_available() and (DEVICE == "cuda" or interpreter_ready())
NO_TRITON = "needs CUDA, or TRITON_INTERPRET=1 before triton's import (test_kernels_fresh_process)"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON))]
pytestmark = pytest.mark.unit
TOL = {torch.float32: 2e-5, torch.bfloat16: 4 * 2.0**-7}
"""Relative to the largest magnitude of the compared tensor."""


def close(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    scale = want.abs().max().item() or 1.0
    err = (got.double() - want).abs().max().item() / scale
    assert err <= TOL[dtype], f"max error {err:.3g} of scale {scale:.3g} (tolerance {TOL[dtype]:.3g})"


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype).to(DEVICE)
    return x, torch.randn(*shape[:-1], generator=g)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 40), (7, 1536), (1, 33), (2500, 24)])
def test_rms_norm_matches_fp64(impl, dtype, shape):
    """(2500, 24): the Triton backward walks several rows per program (2500 = 833 x 3 + 1),
    with a partial last program, and sums dw over programs."""
    x, _ = _inputs(shape, dtype)
    g = torch.Generator().manual_seed(1)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype).to(DEVICE)
    grad = torch.randn(*shape, generator=g).to(dtype).to(DEVICE)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = rms_norm(xr, wr, 1e-6, impl=impl)
    y.backward(grad)
    assert y.dtype == dtype and y.shape == x.shape
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = rms_norm_torch(x64, w64, 1e-6)
    want.backward(grad.double())
    close(y, want, dtype)
    close(xr.grad, x64.grad, dtype)
    close(wr.grad, w64.grad, dtype)
    assert wr.grad.dtype == dtype


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 2 * 40), (5, 2 * 2100), (1, 2)])
def test_swiglu_matches_fp64(impl, dtype, shape):
    x, _ = _inputs(shape, dtype)
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=g).to(dtype).to(DEVICE)
    xr = x.clone().requires_grad_()
    y = swiglu(xr, impl=impl)
    y.backward(grad)
    assert y.dtype == dtype and y.shape == (*shape[:-1], shape[-1] // 2)
    x64 = x.double().requires_grad_()
    want = swiglu_torch(x64)
    want.backward(grad.double())
    close(y, want, dtype)
    close(xr.grad, x64.grad, dtype)


@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_fused_ops_save_less_for_backward():
    """What autograd keeps between forward and backward: the Triton SwiGLU saves only its
    input (the torch path adds silu(gate)); the Triton norm saves the input and one fp32
    statistic per row (the torch path: an fp32 copy, 1/rms and the normalised value)."""

    def saved_bytes(fn, *args):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(*args)
        return sum(seen.values())

    x = torch.randn(64, 2 * 96, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    assert saved_bytes(lambda t: swiglu(t, impl="triton"), x) == x.numel() * 2
    assert saved_bytes(lambda t: swiglu(t, impl="torch"), x) == x.numel() * 2 + 64 * 96 * 2
    h = torch.randn(64, 96, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(96, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    assert saved_bytes(lambda a, b: rms_norm(a, b, 1e-6, impl="triton"), h, w) == h.numel() * 2 + 96 * 2 + 64 * 4
    torch_saved = saved_bytes(lambda a, b: rms_norm(a, b, 1e-6, impl="torch"), h, w)
    assert torch_saved == h.numel() * 4 + 64 * 4 + h.numel() * 2 + 96 * 2


def test_swiglu_module_and_bad_input():
    x = torch.randn(4, 6, device=DEVICE)
    assert torch.equal(SwiGLU(config=None)(x), swiglu(x))
    assert SwiGLU().sharded_state_dict() == {}
    with pytest.raises(ValueError, match="even last dimension"):
        swiglu(torch.randn(4, 5))
    with pytest.raises(ValueError, match="impl"):
        rms_norm(x, torch.ones(6, device=DEVICE), 1e-6, impl="cuda")
    if HAVE_TRITON:
        with pytest.raises(ValueError, match="rms_norm weight has dtype torch.bfloat16; x has torch.float32"):
            rms_norm(x, torch.ones(6, device=DEVICE, dtype=torch.bfloat16), 1e-6, impl="triton")
        with pytest.raises(ValueError, match="rms_norm weight must have shape"):
            rms_norm(x, torch.ones(5, device=DEVICE), 1e-6, impl="triton")
        with pytest.raises(ValueError, match="swiglu x has dtype"):
            swiglu(torch.ones(4, 6, dtype=torch.float64, device=DEVICE), impl="triton")


def test_engine_switches_every_mlp_to_the_swiglu_module():
    """The sdpa layer spec gives every MLP (dense, routed experts, shared expert) the `SwiGLU`
    module, which megatron applies under ``use_te_activation_func``: the config switch and
    the spec go together."""
    from verl_mp.config.parallel import ParallelConfig
    from verl_mp.engine.model import transformer_config
    from verl_mp.models.layer_spec import _moe_mlp_spec, _own_layer_spec
    from verl_mp.models.spec import GPTSpec, MoESpec

    shape = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96,
                 vocab_size=100)
    dense = GPTSpec(**shape)
    moe = GPTSpec(**shape, moe=MoESpec(num_experts=4, top_k=2, ffn_hidden_size=32, shared_expert_ffn_hidden_size=48))
    parallel = ParallelConfig()
    assert transformer_config(dense, parallel, swiglu_module=True).use_te_activation_func
    assert transformer_config(moe, parallel, swiglu_module=True).use_te_activation_func
    assert not transformer_config(dense, parallel).use_te_activation_func
    assert _own_layer_spec(dense, moe_layer=False, swiglu_module=True).submodules.mlp.submodules.activation_func \
        is SwiGLU
    moe_spec = _moe_mlp_spec(moe, swiglu_module=True).submodules
    assert moe_spec.experts.submodules.activation_func is SwiGLU
    assert moe_spec.shared_experts.submodules.activation_func is SwiGLU
    assert _moe_mlp_spec(moe).submodules.experts.submodules.activation_func is None
