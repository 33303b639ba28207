"""`GroupedExperts` on a GPU (bf16: torch's CUTLASS grouped GEMM on Hopper, each expert's rows
padded to an aligned count) against megatron's SequentialMLP in bf16, both measured against an
fp32 computation of the same experts: the grouped kernel must be as accurate as one matmul per
expert. (On CPU the two paths agree bit
for bit: tests/dist/test_engine_moe.py.)"""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _run(runner, prefix, module, dtype, x, per_expert, probs, grad):
    weights = {prefix + k: p.detach().clone().to(dtype).requires_grad_() for k, p in module.named_parameters()}
    xi = x.detach().clone().to(dtype).requires_grad_()
    y, _ = torch.func.functional_call(runner, weights, (xi, per_expert, probs))
    y.backward(grad.to(dtype))
    return [y.float(), xi.grad.float(),
            *(torch.zeros_like(w) if w.grad is None else w.grad.float() for w in weights.values())]


def test_grouped_kernel_is_as_accurate_as_one_matmul_per_expert(tmp_path):
    from transformers import Qwen3MoeConfig

    from verl_mp.config.moe import MoEConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.models.grouped_experts import GroupedExperts, SequentialReference

    Qwen3MoeConfig(hidden_size=1024, intermediate_size=2048, num_hidden_layers=1, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
                   vocab_size=1024, architectures=["Qwen3MoeForCausalLM"]).save_pretrained(tmp_path)
    engine = MegatronEngine(EngineConfig(model_path=str(tmp_path), role="ref", dtype="bf16", attention_backend="sdpa",
                                         moe=MoEConfig(grouped_gemm=True)))
    module = next(m for c in engine.chunks for m in c.modules() if isinstance(m, GroupedExperts))
    counts = torch.full((32,), 401)
    counts[:4], counts[5], counts[7] = 2999, 0, 3  # skewed, one expert empty, counts not multiples of 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(int(counts.sum()), 1024, generator=g).cuda()
    probs, grad = torch.rand(len(x), generator=g).cuda(), torch.randn(len(x), 1024, generator=g).cuda()
    assert module.grouped_applies(x.bfloat16())
    grouped = _run(module, "", module, torch.bfloat16, x, counts.cuda(), probs, grad)
    sequential = _run(SequentialReference(module), "experts.", module, torch.bfloat16, x, counts, probs, grad)
    reference = _run(SequentialReference(module), "experts.", module, torch.float32, x, counts, probs, grad)
    names = ["output", "input grad"] + [f"weight grad {i}" for i in range(len(grouped) - 2)]
    for name, a, b, ref in zip(names, grouped, sequential, reference, strict=True):
        scale = ref.abs().max().clamp(min=1e-6)
        err_grouped, err_sequential = float((a - ref).abs().max() / scale), float((b - ref).abs().max() / scale)
        print(f"{name}: bf16 error vs fp32, grouped {err_grouped:.2e}, sequential {err_sequential:.2e}")
        assert err_grouped <= max(2 * err_sequential, 1e-3) and err_grouped < 2e-2, name
