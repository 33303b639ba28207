"""The planner against measurements and independent references.

- GPU: the engine's train-step peaks on one H200 (Qwen2-1.5B shape, 16 x 4096 tokens,
  bf16; `verl_mp.planner.calibration.MEASUREMENTS`) must be planned within 15%
  (measured: within 0.3%), and a micro-batch that ran out of memory must plan above the
  card; benchmarks/RESULTS.md shows the same table.
- Parameter counts: every rank's share adds up to the model, and the whole model equals
  what HF transformers instantiates from the same config.json (on the meta device).
"""

from pathlib import Path

import pytest
import torch
from planner_models import MODEL_CONFIGS, PUBLISHED_PARAMS

from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.planner import calibration
from verl_mp.planner.dims import Layout, ModelDims, stage_params, total_params, vocab_rows

pytestmark = pytest.mark.unit
RESULTS = Path(__file__).parents[2] / "benchmarks" / "RESULTS.md"


@pytest.mark.parametrize("m", calibration.MEASUREMENTS, ids=lambda m: f"mb{m.micro_batch}-{m.impl}-{m.recompute.granularity or 'none'}")
def test_train_step_peak_within_tolerance(m):
    planned = calibration.planned_peak(m) / calibration.GIB
    if m.measured_gib is None:  # ran out of memory: the plan must not fit the card
        print(f"micro-batch {m.micro_batch}: planned {planned:.1f} GiB, OOM with {m.oom_in_use_gib} GiB in use")
        assert planned > calibration.H200_GIB > m.oom_in_use_gib
        return
    error = (planned - m.measured_gib) / m.measured_gib
    print(f"micro-batch {m.micro_batch} {m.impl}: measured {m.measured_gib} GiB, planned {planned:.1f} ({error:+.1%})")
    assert abs(error) <= calibration.TOLERANCE


def test_results_md_shows_the_current_comparison():
    assert calibration.table() in RESULTS.read_text(), \
        "benchmarks/RESULTS.md is out of date: paste `python -m verl_mp.planner.calibration`"


def test_whole_model_matches_hf_and_model_cards():
    import transformers

    for name, config in MODEL_CONFIGS.items():
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        hf = sum(p.numel() for p in model.parameters())
        ours = total_params(ModelDims.from_spec(spec_from_hf_config(config)))
        assert ours == hf, name
        assert ours == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01), name


@pytest.mark.parametrize("name,tp,pp", [("Qwen2-1.5B", 1, 1), ("Qwen2-1.5B", 2, 1), ("Qwen2-1.5B", 2, 4),
                                        ("Qwen2.5-7B", 4, 2), ("Llama-3.1-70B", 8, 4)])
def test_rank_shares_add_up(name, tp, pp):
    dims = ModelDims.from_spec(spec_from_hf_config(MODEL_CONFIGS[name]))
    layout = Layout(tp=tp, pp=pp)
    per_rank_sum = tp * sum(stage_params(dims, layout, s) for s in range(pp))
    # replicated norms are held by every TP rank; the vocabulary is padded to a TP multiple;
    # a tied embedding gets its own copy on the last stage when PP > 1
    norms = dims.num_layers * 2 * dims.hidden + dims.hidden
    padding = (tp * vocab_rows(dims, tp) - dims.vocab) * dims.hidden * (1 if dims.tied else 2)
    tied_copy = dims.vocab * dims.hidden + padding // (1 if dims.tied else 2) if dims.tied and pp > 1 else 0
    assert per_rank_sum == total_params(dims) + (tp - 1) * norms + padding + tied_copy


def test_moe_hook_counts_experts_like_hf():
    """With Qwen3-30B-A3B's layer shape (2 of its 48 layers) the parameter count equals HF's
    Qwen3-MoE model, and EP divides the routed experts."""
    import transformers

    from verl_mp.planner.dims import MoEDims, layer_params

    shape = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                 num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=4,
                 head_dim=128, vocab_size=151936, tie_word_embeddings=False)
    with torch.device("meta"):
        hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**shape))
    dims = ModelDims(num_layers=2, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144, vocab=151936,
                     tied=False, qk_norm=True, moe=MoEDims(num_experts=128, ffn_hidden_size=768, top_k=8))
    assert total_params(dims) == sum(p.numel() for p in hf.parameters())
    experts = 128 * 3 * 2048 * 768
    assert layer_params(dims, tp=1, ep=1) - layer_params(dims, tp=1, ep=4) == experts - experts // 4


def test_moe_shards_like_the_engine():
    """Qwen3-30B-A3B from its config: each rank holds its experts (split over EP x expert-TP)
    plus the dense part (split over TP); the routed experts' Adam state is sharded over
    expert-DP, the rest over DP (megatron's chained distributed optimizer)."""
    from verl_mp.planner import memory as mem
    from verl_mp.planner.dims import stage_expert_params

    dims = ModelDims.from_spec(spec_from_hf_config(MODEL_CONFIGS["Qwen3-30B-A3B"]))
    assert dims.moe is not None and dims.moe.top_k == 8
    experts = 48 * 128 * 3 * 2048 * 768
    dense = total_params(dims) - experts
    for tp, ep, etp, dp in ((1, 8, None, 8), (1, 8, None, 16), (2, 8, 1, 8), (2, 4, 2, 4)):
        layout = Layout(tp=tp, ep=ep, etp=etp, dp=dp)
        ex = stage_expert_params(dims, layout)
        assert ex == experts // (ep * layout.expert_tp)
        assert layout.edp == tp * dp // (ep * layout.expert_tp)
        state = mem.engine_state_bytes(dims, layout, 0, "bf16", trainable=True)
        per_param = mem.ADAM_BYTES + mem.MAIN_PARAM_BYTES
        assert state.optimizer == per_param * ((stage_params(dims, layout, 0) - ex) // dp + ex // layout.edp)
    assert stage_params(dims, Layout(ep=8, dp=8), 0) - stage_expert_params(dims, Layout(ep=8, dp=8)) == dense


@pytest.mark.parametrize("name,active", [("Qwen3-30B-A3B", 3.3e9), ("Qwen3-235B-A22B", 22e9)])
def test_flop_parameters_are_the_active_ones(name, active):
    """TFLOP/s of a mixture-of-experts run count the active parameters (the model cards'
    "activated" counts include the input embedding, which the FLOP estimate leaves out)."""
    from verl_mp.workers.rank_worker import flop_params

    spec = spec_from_hf_config(MODEL_CONFIGS[name])
    assert flop_params(spec) + spec.vocab_size * spec.hidden_size == pytest.approx(active, rel=0.02)
