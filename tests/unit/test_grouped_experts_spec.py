"""`with_grouped_experts` swaps SequentialMLP for `GroupedExperts` in every layer spec the
engine builds for a MoE model (megatron's local layer spec, the project's MoE MLP spec),
and leaves dense MLPs and freshly built specs alone; `aligned_rows` pads each expert's rows."""

import pytest
import torch

pytestmark = pytest.mark.unit


def test_local_layer_spec_gets_grouped_experts_and_a_fresh_spec_does_not():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.experts import SequentialMLP

    from verl_mp.models.grouped_experts import GroupedExperts
    from verl_mp.models.layer_spec import with_grouped_experts

    layer = with_grouped_experts(get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False))
    assert layer.submodules.mlp.submodules.experts.module is GroupedExperts
    fresh = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False)
    assert fresh.submodules.mlp.submodules.experts.module is SequentialMLP
    dense = get_gpt_layer_local_spec()
    assert with_grouped_experts(dense) is dense and not hasattr(dense.submodules.mlp.submodules, "experts")


@pytest.mark.parametrize("grouped", [True, False])
def test_moe_mlp_spec_follows_the_setting(grouped):
    from megatron.core.transformer.moe.experts import SequentialMLP

    from verl_mp.models.grouped_experts import GroupedExperts
    from verl_mp.models.layer_spec import _moe_mlp_spec

    class Spec:  # the fields _moe_mlp_spec reads
        class moe:
            num_experts = 8

    spec = _moe_mlp_spec(Spec, swiglu_module=True, grouped_experts=grouped)
    assert spec.submodules.experts.module is (GroupedExperts if grouped else SequentialMLP)


def test_aligned_rows_pads_each_expert_to_16():
    from verl_mp.models.grouped_experts import ALIGN_ROWS, aligned_rows

    rows, offs, total = aligned_rows(torch.tensor([5, 0, 16, 17]), "cpu")
    assert ALIGN_ROWS == 16 and offs.tolist() == [16, 16, 32, 64] and offs.dtype == torch.int32 and total == 64
    assert rows.tolist() == [*range(0, 5), *range(16, 32), *range(32, 49)]
    rows, offs, total = aligned_rows(torch.tensor([16, 0, 32]), "cpu")
    assert rows is None and offs.tolist() == [16, 16, 48] and total == 48
