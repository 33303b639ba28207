"""A tiny character/word-level tokenizer for the synthetic arithmetic task and for tests.

Every digit, operator and ASCII letter is its own token, and a handful of words that the
prompts use (``What``, ``is``, ``####``, ...) are whole tokens, so the vocabulary stays
under 128 entries and any ASCII text round-trips exactly (decoding concatenates tokens).
Characters outside the alphabet map to ``<|unk|>``.

The chat template follows Qwen's ChatML layout::

    <|im_start|>user\\nWhat is 37+48?<|im_end|>\\n<|im_start|>assistant\\n

``eos_token`` is ``<|im_end|>`` (generation of an assistant turn stops there, as with
Qwen instruct models) and ``pad_token`` is ``<|pad|>``.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
ENDOFTEXT_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN, ENDOFTEXT_TOKEN, UNK_TOKEN)

# Whole-word tokens: the words of the synthetic prompts, the GSM8K instruction and the
# chat roles. Kept short on purpose: the vocabulary must stay below 128 entries.
WORDS = (
    "What", "is", "Let's", "think", "step", "by", "and", "output", "the", "final",
    "answer", "after", "user", "assistant", "system", "####",
)
PUNCTUATION = " \n+-*/=?.,!'\"#$%()[]{}:;<>_\\^|&@~`"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _vocab() -> dict[str, int]:
    """Token -> id, special tokens first (so ``<|pad|>`` is id 0)."""
    tokens = list(SPECIAL_TOKENS) + list(string.digits) + list(PUNCTUATION)
    tokens += list(string.ascii_letters) + list(WORDS)
    assert len(tokens) == len(set(tokens)), "duplicate token in the tiny vocabulary"
    return {tok: i for i, tok in enumerate(tokens)}


def _split_pattern() -> str:
    """Regex isolating whole words (longest first) and otherwise single characters."""
    words = sorted(WORDS, key=len, reverse=True)
    alternatives = [re.escape(w) if not w[0].isalpha() else rf"\b{re.escape(w)}\b" for w in words]
    return "|".join(alternatives) + r"|[\s\S]"


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny tokenizer in memory (no files, no downloads)."""
    vocab = _vocab()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(_split_pattern()), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, ENDOFTEXT_TOKEN],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tiny_tokenizer(output_dir: str | Path) -> Path:
    """Build the tokenizer and ``save_pretrained`` it; load it back with AutoTokenizer."""
    output_dir = Path(output_dir)
    build_tiny_tokenizer().save_pretrained(str(output_dir))
    return output_dir
