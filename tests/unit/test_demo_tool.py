"""The tool demo's pieces (verl_mp/demo/tool_demo.py): its tokenizer, its data, and the warm
start's conversations, tokenized exactly as the multi-turn rollout will see them."""

import pytest

from verl_mp.data.chat_fragments import ToolResponseFormat
from verl_mp.demo.tokenizer import build_tiny_tokenizer
from verl_mp.demo.tool_demo import TOOL_DEMO, TOOL_TOKENS, TOOL_WORDS, build_tool_tokenizer, call_text, conversation, \
    problem_rows
from verl_mp.reward.tool_parser import hermes
from verl_mp.reward.tools import calculator

pytestmark = pytest.mark.unit


def test_tool_tokenizer_extends_the_tiny_one(tmp_path):
    from transformers import AutoTokenizer

    base, tok = build_tiny_tokenizer(), build_tool_tokenizer()
    assert all(base.convert_ids_to_tokens(i) == tok.convert_ids_to_tokens(i) for i in range(len(base)))
    for word in TOOL_WORDS:  # each merged into one token
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    for token in TOOL_TOKENS:
        assert len(tok.encode(f"x{token}y", add_special_tokens=False)) == 3, token
    text = call_text(374, 812)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 24 and tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)  # as the trainer and vLLM load it
    assert len(loaded) == len(tok) and loaded.encode(text, add_special_tokens=False) == ids


def test_calls_and_data():
    good, bad = hermes(call_text(374, 812)), hermes(call_text(374, 812, well_formed=False))
    assert calculator(good[0].arguments) == str(374 * 812) and bad[0].error is not None
    test = problem_rows(50, 0, "test")
    train = problem_rows(200, 0, "train", {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in test})
    keys = [(r["extra_info"]["a"], r["extra_info"]["b"]) for r in test + train]
    assert len(set(keys)) == 250 and all(100 <= a <= 999 and 100 <= b <= 999 for a, b in keys)
    assert test[0]["reward_model"]["ground_truth"] == str(keys[0][0] * keys[0][1])


@pytest.mark.parametrize("kind", ["direct", "good", "malformed"])
def test_warm_start_conversations_are_what_the_rollout_builds(kind):
    """The teacher's conversation: the prompt, the model's turns (ids + EOS, mask 1) and the tool
    response as the rollout's fragments encode it (cut to the preset's 16 tokens, mask 0)."""
    tok = build_tool_tokenizer()
    fmt = ToolResponseFormat(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 374*812?"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    ids, mask = conversation(tok, fmt, prompt, 374, 812, kind, TOOL_DEMO.max_tool_response_tokens)
    assert ids[: len(prompt)] == prompt and mask[: len(prompt)] == [0] * len(prompt) and len(ids) == len(mask)
    answer = tok.encode("#### 303688", add_special_tokens=False) + [tok.eos_token_id]
    assert ids[-len(answer):] == answer and mask[-len(answer):] == [1] * len(answer)
    if kind == "direct":
        assert len(ids) == len(prompt) + len(answer)
        return
    first = tok.encode(call_text(374, 812, well_formed=kind == "good"), add_special_tokens=False) + [tok.eos_token_id]
    assert ids[len(prompt): len(prompt) + len(first)] == first
    tool = ids[len(prompt) + len(first): -len(answer)]
    assert set(mask[len(prompt) + len(first): -len(answer)]) == {0}
    content = "303688" if kind == "good" else None
    if content is not None:
        assert tool == fmt.encode([fmt.content_ids(content)], after_eos=True)
    else:
        assert tok.decode(tool).startswith("\n<|im_start|>tool\nerror: malformed")  # cut to 16 tokens
        assert len(tool) == len(fmt.encode([[0] * TOOL_DEMO.max_tool_response_tokens], after_eos=True))
