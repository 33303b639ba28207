"""``attention_bias=True`` is read as q/k/v biases only where that is what it means: an
architecture with q/k/v biases whose config turns the output projection's bias off
separately (``attention_out_bias=false``, Seed-OSS). Everywhere else it is refused."""

import pytest

from verl_mp.models.hf_config import spec_from_hf_config

pytestmark = pytest.mark.unit


def config(arch, model_type, **kw):
    return dict(architectures=[arch], model_type=model_type, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=97, **kw)


def test_qkv_bias_architecture_with_output_bias_off_is_accepted():
    spec = spec_from_hf_config(config("Qwen2ForCausalLM", "qwen2", attention_bias=True, attention_out_bias=False))
    assert spec.add_qkv_bias


@pytest.mark.parametrize("arch,model_type,extra", [
    ("Qwen2ForCausalLM", "qwen2", {}),  # attention_bias alone: Llama's meaning (q/k/v/o)
    ("Qwen2ForCausalLM", "qwen2", {"attention_out_bias": True}),
    ("LlamaForCausalLM", "llama", {"attention_out_bias": False}),  # Llama has no q/k/v bias rule
])
def test_other_attention_biases_are_refused(arch, model_type, extra):
    with pytest.raises(ValueError, match="attention_bias=True"):
        spec_from_hf_config(config(arch, model_type, attention_bias=True, **extra))
