"""SequenceScorer with a tiny randomly initialised Llama classifier (no downloads)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from verl_mp.demo.tokenizer import build_tiny_tokenizer
from verl_mp.reward.manager import RewardManager
from verl_mp.reward.reward_model import SequenceScorer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def scorer():
    torch.manual_seed(0)
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, num_labels=1,
    )
    return SequenceScorer(LlamaForSequenceClassification(config), tokenizer, batch_size=2)


def test_scores_are_padding_invariant(scorer):
    texts = ["What is 1+2?\n#### 3", "#### 85", "What is 12+30? Let's think step by step.\n#### 42"]
    batched = scorer.score(texts)
    one_by_one = torch.cat([scorer.score([t]) for t in texts])
    assert batched.shape == (3,) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=1e-5)
    assert len(set(batched.tolist())) == 3


def _direct_score(model, ids: list[int]) -> float:
    """The classifier's score of one unpadded sequence, from the backbone's last hidden
    state at its last token and the score head (no padding, no pad-token lookup)."""
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state  # [1, L, H]
        return float(model.score(hidden[0, -1]))


def test_scores_equal_a_direct_hf_forward(scorer):
    """Batched scores equal the model's own head on each text alone; a text longer than
    ``max_length`` is scored on its last ``max_length`` tokens (the response end).
    Shown to fail with ``truncation_side = "right"`` (the long text) and without
    ``model.config.pad_token_id`` (HF then reads the last, padded position)."""
    texts = ["What is 1+2?\n#### 3", "#### 85", "What is 12+30? Let's think step by step.\n#### 42"]
    long_text = "What is 7+8? " * 12 + "#### 15"
    tok = scorer.tokenizer
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts + [long_text]]
    limit = 24
    assert len(ids[-1]) > limit and len({len(i) for i in ids[:3]}) == 3  # padding and truncation happen
    want = torch.tensor([_direct_score(scorer.model, i) for i in ids[:3]]
                        + [_direct_score(scorer.model, ids[-1][-limit:])])
    short = SequenceScorer(scorer.model, tok, max_length=limit, batch_size=4)
    got = torch.cat([scorer.score(texts), short.score([long_text])])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rejects_multi_label_model():
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_labels=2)
    with pytest.raises(ValueError, match="num_labels=1"):
        SequenceScorer(LlamaForSequenceClassification(config), tokenizer)


def test_manager_adds_model_score(scorer):
    manager = RewardManager(num_workers=0, reward_model=scorer)
    prompts, responses = ["What is 1+2?\n", "What is 1+3?\n"], ["#### 3", "#### 5"]
    result = manager.score(responses, ["3", "4"], ["synthetic_arith"] * 2, prompts=prompts)
    model_scores = scorer.score([p + r for p, r in zip(prompts, responses, strict=True)])
    torch.testing.assert_close(result.scores, torch.tensor([1.0, 0.0]) + model_scores)
    assert result.metrics["reward/rule_score/mean"] == 0.5
    assert "reward/model_score/mean" in result.metrics


def test_manager_replace_uses_only_model_scores():
    # no rule function exists for this source: with combine=replace none runs
    manager = RewardManager(num_workers=0, model_combine="replace", model_coef=2.0)
    result = manager.score(["#### 3", "#### 5"], ["3", "4"], ["no_such_source"] * 2,
                           model_scores=torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(result.scores, torch.tensor([1.0, -2.0]))
    assert result.metrics["reward/score/mean"] == -0.5 and "reward/accuracy" not in result.metrics
    assert result.metrics["reward/model_score/mean"] == -0.25
