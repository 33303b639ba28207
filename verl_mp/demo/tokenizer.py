"""A tiny byte-level BPE chat tokenizer in Qwen2's format, for the synthetic task and tests.

Its layout is exactly Qwen2's (NFC normaliser, Qwen2's pre-tokenizer regex, byte-level
pre-tokenizer and decoder, BPE without unknown token), with a tiny vocabulary: the 256
byte symbols, four special tokens and a few whole words of the prompts (``What``,
``is``, ``####``, ``user``, ...) with the merges that build them. Every digit is its own
token, and any text round-trips exactly.

Why Qwen2's format: transformers 5 loads the tokenizer of a ``model_type: qwen2``
directory as ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says, and that class
rebuilds the pipeline above from the saved vocabulary and merges. A tokenizer in any other
format comes back mangled (an earlier word-level version lost every space: ``What is``
became ``Whatis``), both in the trainer and in vLLM, which loads it the same way. In this
format the saved tokenizer loads back as itself, with or without a ``config.json`` next to
it (tests/unit/test_data_tiny_tokenizer.py checks this, also against vLLM's loader).

The chat template follows Qwen's ChatML layout::

    <|im_start|>user\\nWhat is 37+48?<|im_end|>\\n<|im_start|>assistant\\n

``eos_token`` is ``<|im_end|>`` (generation of an assistant turn stops there, as with
Qwen instruct models) and ``pad_token`` is ``<|pad|>`` (id 0).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import Qwen2TokenizerFast

PAD_TOKEN = "<|pad|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
ENDOFTEXT_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN, ENDOFTEXT_TOKEN)

# Whole-word tokens: the words of the synthetic prompts, of the GSM8K instruction and the
# chat roles ("'s" is split off by the regex, as in "Let's"). Each needs its prefixes as
# tokens too (BPE builds a word one merge at a time), so the list stays short. A leading
# space stays its own token (no "Ġis"). The vocabulary has 311 entries: odd, so that TP=2
# and TP=4 pad it (tests/dist/test_rollout_sync.py exercises that).
WORDS = (
    "What", "is", "user", "assistant", "system", "####", "think", "step", "by", "and",
    "output", "the", "final", "answer", "after", "'s",
)

# Qwen2's pre-tokenizer regex (transformers' tokenization_qwen2.py, which rebuilds it).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins of GPT-2 byte-level BPE, in byte order (space is 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def _merges() -> list[tuple[str, str]]:
    """Merges that build each word left to right; longer words first, so a shorter word's
    merge (``i s``) never splits a longer word that contains it (``assistant``)."""
    merges: list[tuple[str, str]] = []
    for word in sorted(WORDS, key=lambda w: (-len(w), w)):
        if word == "####":  # two equal halves: '#'+'#', then '##'+'##'
            pairs = [("#", "#"), ("##", "##")]
        else:
            pairs = [(word[:i], word[i]) for i in range(1, len(word))]
        merges += [p for p in pairs if p not in merges]
    return merges


def _vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    """Token -> id: special tokens first (``<|pad|>`` is 0), the 256 bytes, merged tokens."""
    tokens = list(SPECIAL_TOKENS) + _byte_symbols()
    tokens += [a + b for a, b in merges if a + b not in tokens]
    assert len(tokens) == len(set(tokens)), "duplicate token in the tiny vocabulary"
    return {tok: i for i, tok in enumerate(tokens)}


def _backend() -> Tokenizer:
    """The tokenizers pipeline, built the way transformers' Qwen2Tokenizer builds its own."""
    merges = _merges()
    core = Tokenizer(models.BPE(vocab=_vocab(merges), merges=merges, dropout=None, unk_token=None,
                                continuing_subword_prefix="", end_of_word_suffix="",
                                fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    return core


def build_tiny_tokenizer() -> Qwen2TokenizerFast:
    """Build the tiny tokenizer in memory (no files, no downloads)."""
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=_backend(),
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START_TOKEN, ENDOFTEXT_TOKEN],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tiny_tokenizer(output_dir: str | Path) -> Path:
    """Build the tokenizer and ``save_pretrained`` it; ``AutoTokenizer`` loads it back exactly."""
    output_dir = Path(output_dir)
    build_tiny_tokenizer().save_pretrained(str(output_dir))
    return output_dir
