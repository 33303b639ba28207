"""The tiny tokenizer: saved and loaded back (alone, next to a Qwen2 model, by vLLM) it is
the same tokenizer, and responses decode to the text the rewards expect. Padded to Qwen2's
151,936 entries it still encodes every text exactly as unpadded."""

import json
import time

import pytest
from transformers import AutoTokenizer

from verl_mp.demo.tiny_models import save_tiny_qwen2
from verl_mp.demo.tokenizer import FILLER, WORDS, build_tiny_tokenizer, save_tiny_tokenizer
from verl_mp.reward.rules import arith_exact_reward

pytestmark = pytest.mark.unit

TEXTS = [
    "What is 374+8?",
    "#### 382",
    "  two  spaces,\ttab\n\nnewlines \n",
    "Let's think step by step and output the final answer after \"####\".",
    "This assistant's system: é ü 日本 ### ##### x",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n#### 4<|im_end|>",
]


QWEN2_VOCAB = 151936


@pytest.fixture(scope="module")
def saved_dirs(tmp_path_factory):
    """Tokenizer-only and Qwen2 model directories (what the demo and tests load), unpadded
    and padded to Qwen2's vocabulary."""
    root = tmp_path_factory.mktemp("tok")
    return {"tokenizer_only": save_tiny_tokenizer(root / "tok"),
            "qwen2_model": save_tiny_qwen2(root / "model", hidden_size=64, num_layers=1),
            "padded_tokenizer_only": save_tiny_tokenizer(root / "tok_padded", vocab_size=QWEN2_VOCAB),
            "padded_qwen2_model": save_tiny_qwen2(root / "model_padded", hidden_size=64, num_layers=1,
                                                  tie_word_embeddings=True, vocab_size=QWEN2_VOCAB)}


def _vocab_size(kind: str) -> int | None:
    return QWEN2_VOCAB if kind.startswith("padded") else None


def _assert_same(loaded, built):
    assert type(loaded) is type(built) and len(loaded) == len(built)
    assert loaded.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    assert (loaded.pad_token_id, loaded.eos_token_id) == (built.pad_token_id, built.eos_token_id)
    assert loaded.all_special_tokens == built.all_special_tokens
    for text in TEXTS:
        ids = built.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, text
        assert loaded.decode(ids) == built.decode(ids) == text


@pytest.mark.parametrize("kind", ["tokenizer_only", "qwen2_model", "padded_tokenizer_only", "padded_qwen2_model"])
def test_auto_tokenizer_loads_the_saved_tokenizer(saved_dirs, kind):
    # transformers 5 loads a qwen2 directory as Qwen2Tokenizer, rebuilt from vocab + merges:
    # the saved tokenizer must be in that format, or spaces are lost ("Whatis").
    _assert_same(AutoTokenizer.from_pretrained(saved_dirs[kind]), build_tiny_tokenizer(_vocab_size(kind)))


@pytest.mark.parametrize("kind", ["qwen2_model", "padded_qwen2_model"])
def test_vllm_loads_the_same_tokenizer(saved_dirs, kind):
    tokenizers = pytest.importorskip("vllm.tokenizers")
    built = build_tiny_tokenizer(_vocab_size(kind))
    loaded = tokenizers.get_tokenizer(str(saved_dirs[kind]))
    assert len(loaded) == len(built) and loaded.eos_token_id == built.eos_token_id
    for text in TEXTS:
        ids = built.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, text
        assert loaded.decode(ids) == text


def test_padded_tokenizer_encodes_as_unpadded_and_matches_the_model(saved_dirs):
    start = time.perf_counter()
    padded = build_tiny_tokenizer(QWEN2_VOCAB)
    built_s = time.perf_counter() - start
    base = build_tiny_tokenizer()
    # 151,936 entries in seconds, not in the minutes of a vocabulary built merge by merge:
    # measured 0.2 s on an idle 2-core machine, 4.2 s at load 16-40 on 2 cores (2026-12-05)
    assert len(padded) == QWEN2_VOCAB and built_s < 60, built_s
    config = json.loads((saved_dirs["padded_qwen2_model"] / "config.json").read_text())
    assert config["vocab_size"] == QWEN2_VOCAB and config["eos_token_id"] == base.eos_token_id
    # The demo's cache probe and every text: the same ids; fillers only after the real tokens.
    probe = base.apply_chat_template([{"role": "user", "content": "What is 374+8?"}], add_generation_prompt=True,
                                     tokenize=False) + "#### 382."
    for text in [probe, *TEXTS, FILLER.format(len(base)) + " " + FILLER.format(QWEN2_VOCAB - 1)]:
        ids = padded.encode(text, add_special_tokens=False)
        assert ids == base.encode(text, add_special_tokens=False) and max(ids) < len(base), text
    assert padded.get_vocab() == {**base.get_vocab(), **{FILLER.format(i): i for i in range(len(base), QWEN2_VOCAB)}}
    # A sampled filler decodes to its name (printable bytes), not to an error or to nothing.
    assert padded.decode([len(base), QWEN2_VOCAB - 1]) == FILLER.format(len(base)) + FILLER.format(QWEN2_VOCAB - 1)
    with pytest.raises(ValueError, match="vocab_size=100 is smaller"):
        build_tiny_tokenizer(100)


def test_vocabulary_words_and_digits():
    tok = build_tiny_tokenizer()
    assert len(tok) == 311 and len(tok) % 2 == 1  # odd: TP=2 pads the vocabulary
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id == 0 and tok.eos_token == "<|im_end|>"
    for word in WORDS:
        assert tok.tokenize(word) == [word]
    for digit in "0123456789":
        assert len(tok.encode(digit * 5, add_special_tokens=False)) == 5
    tokens = tok.tokenize("What is 1234-987?\n#### 247")
    assert tokens[:8] == ["What", "Ġ", "is", "Ġ", "1", "2", "3", "4"] and "####" in tokens


def test_chat_template(saved_dirs):
    tok = AutoTokenizer.from_pretrained(saved_dirs["qwen2_model"])
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.decode(ids) == text


@pytest.mark.parametrize("response,score", [("#### 382", 1.0), ("#### 382.", 0.0), ("382\n#### 382", 1.0)])
def test_responses_decode_to_what_the_reward_scores(saved_dirs, response, score):
    # As the trainer scores a rollout: response ids (+ EOS) -> batch_decode without specials.
    tok = AutoTokenizer.from_pretrained(saved_dirs["qwen2_model"])
    ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    text = tok.batch_decode([ids], skip_special_tokens=True)[0]
    assert text == response
    assert arith_exact_reward("synthetic_arith", text, "382", None)["score"] == score
