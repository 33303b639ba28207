"""docs/extending.md's model-architecture example: registering Seed-OSS with one
`Architecture` makes the engine load a (tiny, random) Seed-OSS checkpoint built by HF
transformers at TP=2 and compute the same per-token log-probs as HF (fp32, <= 1e-4)."""

import json
import re
from pathlib import Path

import pytest
import torch

from verl_mp.demo.tiny_models import randomize_
from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist
DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
PROG = str(Path(__file__).parent / "progs" / "doc_architecture.py")


def tiny_seed_oss(path: Path) -> Path:
    from transformers import SeedOssConfig, SeedOssForCausalLM

    config = SeedOssConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True,
                           attention_out_bias=False, residual_dropout=0.0, max_position_embeddings=256,
                           tie_word_embeddings=False)
    torch.manual_seed(0)
    model = SeedOssForCausalLM(config)
    randomize_(model, seed=0)  # random biases and norm weights: layout bugs show
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def test_registered_architecture_matches_hf(tmp_path):
    snippet = re.search(r"<!-- example: register_seed_oss -->\n```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    (tmp_path / "snippet.py").write_text(snippet)
    model = tiny_seed_oss(tmp_path / "seed_oss")
    out = tmp_path / "res.json"
    launch_local(PROG, 2, ["--snippet", tmp_path / "snippet.py", "--model", model, "--tp", 2, "--out", out],
                 module=False, timeout_s=300, capture_output=True)
    result = json.loads(out.read_text())
    print(result)
    assert result["max_abs_diff"] <= 1e-4
