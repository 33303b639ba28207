"""A tiny byte-level BPE chat tokenizer in Qwen2's format, for the synthetic task and tests.

Its layout is exactly Qwen2's (NFC normaliser, Qwen2's pre-tokenizer regex, byte-level
pre-tokenizer and decoder, BPE without unknown token), with a tiny vocabulary: the 256
byte symbols, four special tokens and a few whole words of the prompts (``What``,
``is``, ``####``, ``user``, ...) with the merges that build them. Every digit is its own
token, and any text round-trips exactly.

``vocab_size`` pads it to a real model's vocabulary (151,936 for Qwen2): filler entries
``<|filler_N|>`` after the real tokens, plain vocabulary entries (not added tokens) that no
merge builds. BPE only emits a byte symbol or the result of a merge, so no text encodes to
a filler and every text encodes exactly as unpadded (same ids). A filler the model samples
decodes to its own name (its symbols are printable ASCII bytes). The GPU demo uses this so
that the LM head has the full vocabulary's cost and the tokenizer still matches the model.

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


def _merges(extra_words: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Merges that build each word left to right; longer words first, so a shorter word's
    merge (``i s``) never splits a longer word that contains it (``assistant``).
    ``extra_words`` (any bytes: ``' {"'``) come after, so the base ids stay what they are."""
    merges: list[tuple[str, str]] = []
    for word in sorted(WORDS, key=lambda w: (-len(w), w)):
        if word == "####":  # two equal halves: '#'+'#', then '##'+'##'
            pairs = [("#", "#"), ("##", "##")]
        else:
            pairs = [(word[:i], word[i]) for i in range(1, len(word))]
        merges += [p for p in pairs if p not in merges]
    symbols = _byte_symbols()
    for word in sorted(extra_words, key=lambda w: (-len(w), w)):
        word = "".join(symbols[b] for b in word.encode())
        merges += [p for p in ((word[:i], word[i]) for i in range(1, len(word))) if p not in merges]
    return merges


def _vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    """Token -> id: special tokens first (``<|pad|>`` is 0), the 256 bytes, merged tokens."""
    tokens = list(SPECIAL_TOKENS) + _byte_symbols()
    tokens += [a + b for a, b in merges if a + b not in tokens]
    assert len(tokens) == len(set(tokens)), "duplicate token in the tiny vocabulary"
    return {tok: i for i, tok in enumerate(tokens)}


FILLER = "<|filler_{}|>"
"""Name of padding entry N. Letters and digits together: Qwen2's regex never makes that one
pre-token, so even a BPE that looks whole words up (``ignore_merges``) could not emit it."""


def _padded(vocab: dict[str, int], vocab_size: int | None) -> dict[str, int]:
    """``vocab`` with filler entries appended up to ``vocab_size`` entries (None: unpadded)."""
    if vocab_size is None:
        return vocab
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tiny tokenizer's {len(vocab)} real tokens; "
                         f"give vocab_size >= {len(vocab)} (or None for the unpadded vocabulary)")
    start = len(vocab)
    return {**vocab, **{FILLER.format(i): i for i in range(start, vocab_size)}}


def _backend(vocab_size: int | None = None, extra_words: tuple[str, ...] = ()) -> Tokenizer:
    """The tokenizers pipeline, built the way transformers' Qwen2Tokenizer builds its own."""
    merges = _merges(extra_words)
    core = Tokenizer(models.BPE(vocab=_padded(_vocab(merges), vocab_size), merges=merges, dropout=None, unk_token=None,
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


def build_tiny_tokenizer(vocab_size: int | None = None, extra_words: tuple[str, ...] = (),
                         added_tokens: tuple[str, ...] = ()) -> Qwen2TokenizerFast:
    """Build the tiny tokenizer in memory (no files, no downloads); ``vocab_size`` pads it
    with fillers to exactly that many entries (``len(tokenizer) == vocab_size``).
    ``extra_words``: more merged tokens (after the base ones); ``added_tokens``: whole tokens
    matched before pre-tokenization and decoded as text (as Qwen's ``<tool_call>``), last."""
    from tokenizers import AddedToken

    if added_tokens and vocab_size is not None:
        raise ValueError("added_tokens go after the vocabulary; they cannot be combined with a padded vocab_size")
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=_backend(vocab_size, extra_words),
        pad_token=PAD_TOKEN,
        eos_token=IM_END_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START_TOKEN, ENDOFTEXT_TOKEN],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if added_tokens:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    return tokenizer


def save_tiny_tokenizer(output_dir: str | Path, vocab_size: int | None = None, extra_words: tuple[str, ...] = (),
                        added_tokens: tuple[str, ...] = ()) -> Path:
    """Build the tokenizer and ``save_pretrained`` it; ``AutoTokenizer`` loads it back exactly."""
    output_dir = Path(output_dir)
    build_tiny_tokenizer(vocab_size, extra_words, added_tokens).save_pretrained(str(output_dir))
    return output_dir
