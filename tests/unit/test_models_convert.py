"""HF <-> megatron conversion as pure functions: registry, specs, rope, layouts, TP slicing."""

import pytest
import torch

from verl_mp.engine.layout import merge_tp_shards, split_tp_shard
from verl_mp.models.convert import (
    expected_hf_shapes,
    fuse_qkv,
    hf_export_dtype,
    hf_names,
    hf_to_megatron,
    megatron_global_names,
    megatron_to_hf,
    tp_shard_plan,
)
from verl_mp.models.hf_config import spec_from_hf_config
from verl_mp.models.registry import (
    ARCHITECTURES,
    Architecture,
    get_architecture,
    register_architecture,
)
from verl_mp.models.rope import rope_inv_freq
from verl_mp.models.spec import GPTSpec, YarnSpec, padded_vocab_size

pytestmark = pytest.mark.unit


def config(arch="LlamaForCausalLM", **kw):
    base = dict(architectures=[arch], model_type=get_architecture(arch).model_type, hidden_size=64,
                intermediate_size=96, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                vocab_size=101, rms_norm_eps=1e-5, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    return {**base, **kw}


SPECS = {
    "llama": spec_from_hf_config(config()),
    "qwen2_tied": spec_from_hf_config(config("Qwen2ForCausalLM", tie_word_embeddings=True)),
    "qwen3": spec_from_hf_config(config("Qwen3ForCausalLM", head_dim=12)),
    "mistral": spec_from_hf_config(config("MistralForCausalLM", sliding_window=16)),
    "critic": spec_from_hf_config(config("LlamaForTokenClassification")),
    "qwen3_moe": spec_from_hf_config(config("Qwen3MoeForCausalLM", head_dim=12, num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, norm_topk_prob=True)),
    "qwen2_moe": spec_from_hf_config(config("Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, shared_expert_intermediate_size=48)),
    "mixtral": spec_from_hf_config(config("MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)),
}
_DEEPSEEK = dict(num_hidden_layers=3, num_key_value_heads=8, n_routed_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, n_shared_experts=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                 first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                 v_head_dim=12, rope_interleave=True, norm_topk_prob=True)
SPECS["deepseek_v3"] = spec_from_hf_config(config("DeepseekV3ForCausalLM", **_DEEPSEEK))
SPECS["deepseek_v3_no_q_lora"] = spec_from_hf_config(config("DeepseekV3ForCausalLM", **{**_DEEPSEEK, "q_lora_rank": None}))


def random_hf_state(spec: GPTSpec, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in expected_hf_shapes(spec).items()}


def test_registry_is_explicit_and_refuses_unknown_and_duplicates():
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"} <= set(ARCHITECTURES)
    with pytest.raises(ValueError, match="not supported; supported architectures"):
        get_architecture("GPT2LMHeadModel")
    with pytest.raises(ValueError, match="already registered"):
        register_architecture(Architecture("LlamaForCausalLM", "llama", ()))
    # no substring matching: a look-alike name is refused
    with pytest.raises(ValueError):
        get_architecture("MyLlamaForCausalLM")


def test_spec_fields_per_architecture():
    assert SPECS["qwen2_tied"].add_qkv_bias and SPECS["qwen2_tied"].tie_word_embeddings
    assert SPECS["qwen3"].qk_layernorm and SPECS["qwen3"].head_dim == 12
    assert SPECS["mistral"].sliding_window == 16
    assert SPECS["llama"].num_query_groups == 2 and SPECS["llama"].rotary_base == 500000.0
    assert SPECS["critic"].value_head and not SPECS["critic"].tie_word_embeddings


def test_moe_specs_per_architecture():
    q3, q2, mx = SPECS["qwen3_moe"].moe, SPECS["qwen2_moe"].moe, SPECS["mixtral"].moe
    assert (q3.num_experts, q3.top_k, q3.ffn_hidden_size, q3.norm_topk_prob) == (4, 2, 32, True)
    assert q3.shared_expert_ffn_hidden_size is None and not q3.shared_expert_gate
    assert not q2.norm_topk_prob and q2.shared_expert_ffn_hidden_size == 48 and q2.shared_expert_gate
    assert mx.ffn_hidden_size == 96 and mx.norm_topk_prob  # Mixtral: intermediate_size, always renormalised
    names = megatron_global_names(SPECS["mixtral"])
    assert "decoder.layers.1.mlp.experts.3.linear_fc2.weight" in names
    assert hf_names(SPECS["mixtral"], "decoder.layers.1.mlp.experts.3.linear_fc1.weight") == (
        "model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.block_sparse_moe.experts.3.w3.weight")
    assert hf_names(SPECS["qwen2_moe"], "decoder.layers.0.mlp.shared_experts.gate_weight") == (
        "model.layers.0.mlp.shared_expert_gate.weight",)
    with pytest.raises(KeyError):  # expert index beyond num_experts
        hf_names(SPECS["mixtral"], "decoder.layers.0.mlp.experts.4.linear_fc2.weight")


def test_deepseek_v3_spec_and_per_layer_tensors():
    spec = SPECS["deepseek_v3"]
    m, mla = spec.moe, spec.mla
    assert (m.score_function, m.expert_bias, m.scaling_factor, m.num_groups, m.group_topk) == ("sigmoid", True, 2.5, 2, 1)
    assert m.shared_expert_ffn_hidden_size == 64 and not m.shared_expert_gate and m.first_dense_layers == 1
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.q_head_dim, mla.v_head_dim) == (24, 32, 24, 12)
    assert spec.head_dim == 8  # the rotary dimension
    names = set(megatron_global_names(spec))
    assert "decoder.layers.0.mlp.linear_fc1.weight" in names and "decoder.layers.1.mlp.linear_fc1.weight" not in names
    assert not any(n.startswith("decoder.layers.0.mlp.") and "fc" not in n for n in names)  # no router/experts
    assert {"decoder.layers.2.mlp.router.expert_bias", "decoder.layers.2.mlp.experts.3.linear_fc2.weight",
            "decoder.layers.1.mlp.shared_experts.linear_fc1.weight"} <= names
    assert hf_names(spec, "decoder.layers.1.mlp.router.expert_bias") == ("model.layers.1.mlp.gate.e_score_correction_bias",)
    assert "decoder.layers.0.self_attention.linear_q_down_proj.weight" in names
    assert not any("linear_q_proj" in n for n in names)
    no_q_lora = set(megatron_global_names(SPECS["deepseek_v3_no_q_lora"]))
    assert "decoder.layers.0.self_attention.linear_q_proj.weight" in no_q_lora
    assert not any("q_down" in n or "q_up" in n or "q_layernorm" in n for n in no_q_lora)
    with pytest.raises(KeyError):  # a dense layer has no experts, an MoE layer no dense MLP
        hf_names(spec, "decoder.layers.0.mlp.experts.0.linear_fc2.weight")
    with pytest.raises(KeyError):
        hf_names(spec, "decoder.layers.1.mlp.linear_fc2.weight")
    # HF keeps the routing bias in fp32 in bf16 checkpoints; the export does too
    assert hf_export_dtype("model.layers.1.mlp.gate.e_score_correction_bias", torch.bfloat16) == torch.float32
    assert hf_export_dtype("model.layers.1.mlp.gate.weight", torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("bad,match", [
    (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}),
     "rope type 'dynamic' .* not supported for multi-latent attention"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "attention_factor": 1.2}),
     "attention_factor"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "truncate": False}), "truncate"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "mscale_all_dim": 1.0}),
     "mscale_all_dim=1.0 with mscale=None"),
    (dict(rope_interleave=False), "rope_interleave=false"),
    (dict(norm_topk_prob=False), "norm_topk_prob=False with num_experts_per_tok=2"),
    (dict(n_routed_experts=8, num_experts_per_tok=8, n_group=4, topk_group=2), "num_experts_per_tok // topk_group = 4"),
    (dict(num_key_value_heads=2), "num_key_value_heads=2 must equal num_attention_heads"),
    (dict(first_k_dense_replace=3), "first_k_dense_replace=3"),
])
def test_unsupported_deepseek_v3_configs_raise_naming_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        spec_from_hf_config(config("DeepseekV3ForCausalLM", **{**_DEEPSEEK, **bad}))


@pytest.mark.parametrize("arch,bad,match", [
    ("Qwen3MoeForCausalLM", dict(mlp_only_layers=[1]), "mlp_only_layers"),
    ("Qwen2MoeForCausalLM", dict(decoder_sparse_step=2, shared_expert_intermediate_size=8), "decoder_sparse_step"),
    ("MixtralForCausalLM", dict(router_jitter_noise=0.1), "router_jitter_noise"),
    ("Qwen3MoeForCausalLM", dict(num_local_experts=8), "num_experts/num_local_experts"),
])
def test_unsupported_moe_configs_raise_naming_the_field(arch, bad, match):
    base = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_local_experts=4)
    if arch == "MixtralForCausalLM":
        base.pop("num_experts")
    with pytest.raises(ValueError, match=match):
        spec_from_hf_config(config(arch, **{**base, **bad}))


@pytest.mark.parametrize("rope,want", [
    ({"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
      "original_max_position_embeddings": 4096}, YarnSpec(factor=40.0, original_max_position_embeddings=4096,
                                                          mscale=1.0, mscale_all_dim=1.0)),
    # no mscale_all_dim: HF scales cos/sin by m(factor) and leaves the softmax alone, megatron with (1, 0)
    ({"rope_type": "yarn", "factor": 4.0, "mscale": 0.5}, YarnSpec(factor=4.0, original_max_position_embeddings=512)),
])
def test_deepseek_v3_yarn_maps_onto_megatron(rope, want):
    """DeepSeek-V3's legacy ``rope_scaling`` (transformers 4) and ``rope_parameters`` (5) -> `YarnSpec`."""
    d = {**_DEEPSEEK, "max_position_embeddings": 512, "rope_theta": 1e4}
    d.update(rope_parameters=None, rope_scaling=rope) if "type" in rope else d.update(rope_parameters=rope)
    spec = spec_from_hf_config(config("DeepseekV3ForCausalLM", **d))
    assert spec.mla.yarn == want and spec.rope_type == "yarn"


def test_legacy_transformers4_rope_fields():
    legacy = config(rope_parameters=None, rope_theta=1e6,
                    rope_scaling={"type": "linear", "factor": 4.0})
    spec = spec_from_hf_config(legacy)
    assert spec.rotary_base == 1e6 and spec.rope_type == "linear" and spec.rope_scaling_factor == 4.0


@pytest.mark.parametrize("bad,match", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}), "rope type 'yarn'"),
    (dict(architectures=None), "'architectures' is missing"),
    (dict(model_type="qwen2"), "model_type"),
])
def test_unsupported_configs_raise_naming_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        spec_from_hf_config(config(**bad))


def test_qwen_per_layer_sliding_window_refused():
    with pytest.raises(ValueError, match="use_sliding_window"):
        spec_from_hf_config(config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=8))


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
])
def test_rope_inv_freq_matches_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = config(rope_parameters=rope)
    hf_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    if rope["rope_type"] == "default":
        dim = hf_cfg.head_dim
        expected = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
    assert torch.equal(rope_inv_freq(spec_from_hf_config(cfg)), expected)


def test_fused_qkv_is_interleaved_per_query_group():
    spec = GPTSpec(num_layers=1, hidden_size=8, num_attention_heads=4, num_query_groups=2,
                   ffn_hidden_size=8, vocab_size=8, kv_channels=1, architecture="LlamaForCausalLM")
    q, k, v = torch.tensor([0.0, 1, 2, 3]), torch.tensor([10.0, 11]), torch.tensor([20.0, 21])
    # group 0: q heads 0,1 then k0, v0; group 1: q heads 2,3 then k1, v1
    assert fuse_qkv(q, k, v, spec).tolist() == [0, 1, 10, 20, 2, 3, 11, 21]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_round_trip_is_bitwise_and_covers_every_tensor(name):
    spec = SPECS[name]
    hf = random_hf_state(spec)
    produced = {}
    for mname in megatron_global_names(spec):
        full = hf_to_megatron(spec, mname, hf)
        for hf_name, tensor in megatron_to_hf(spec, mname, full):
            assert hf_name not in produced
            produced[hf_name] = tensor
    assert produced.keys() == hf.keys()
    for key, tensor in hf.items():
        assert torch.equal(produced[key], tensor), key
        assert produced[key].is_contiguous()


def test_tied_head_loads_from_embedding_and_exports_nothing():
    spec = SPECS["qwen2_tied"]
    assert "output_layer.weight" not in megatron_global_names(spec)
    assert hf_names(spec, "output_layer.weight") == ("model.embed_tokens.weight",)
    assert megatron_to_hf(spec, "output_layer.weight", torch.zeros(3)) == []


def test_megatron_to_hf_drops_vocab_padding():
    spec = SPECS["llama"]
    padded = torch.randn(padded_vocab_size(spec.vocab_size, 4), spec.hidden_size)
    [(name, tensor)] = megatron_to_hf(spec, "output_layer.weight", padded)
    assert name == "lm_head.weight" and torch.equal(tensor, padded[: spec.vocab_size])


def _megatron_tp_dim(mname: str):
    if "linear_proj" in mname or "linear_fc2" in mname:
        return 1
    if "down_proj" in mname:  # multi-latent attention's down projections: replicated
        return None
    if any(s in mname for s in ("linear_qkv", "linear_fc1", "word_embeddings", "output_layer.weight",
                                "linear_q_", "linear_kv_")):
        return 0
    return None


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("tp", [1, 2])
def test_tp_shard_plans_reassemble_the_full_tensor(name, tp):
    """Per-rank shards read from HF slices == TP split of the full (padded) megatron tensor."""
    spec = SPECS[name]
    hf = random_hf_state(spec, seed=tp)
    for mname in megatron_global_names(spec) + (["output_layer.weight"] if spec.tie_word_embeddings else []):
        tp_dim = _megatron_tp_dim(mname) if not (spec.value_head and "output_layer" in mname) else None
        layout = "gate_up" if "linear_fc1" in mname else "contiguous"
        shards = []
        for rank in range(tp if tp_dim is not None else 1):
            plan = tp_shard_plan(spec, mname, rank, tp if tp_dim is not None else 1)
            slices = {}
            for r in plan.reads:
                t = hf[r.hf_name]
                slices[r.hf_name] = t if r.dim is None else t.narrow(r.dim, r.start, r.stop - r.start)
            shard = hf_to_megatron(spec, mname, slices)
            shards.append(torch.cat([shard, shard.new_zeros(plan.pad_rows, *shard.shape[1:])]))
        full = merge_tp_shards(shards, tp_dim, layout)
        expected = hf_to_megatron(spec, mname, hf)
        assert torch.equal(full[: expected.shape[0]], expected), mname
        if tp_dim is not None:
            for rank, shard in enumerate(shards):
                assert torch.equal(split_tp_shard(full, tp_dim, layout, rank, tp), shard), mname
