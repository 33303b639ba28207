"""The model directory's tokenizer, checked before a run starts."""

from __future__ import annotations

from typing import Any

_FIX = "the directory needs the tokenizer files saved with the model (tokenizer.json, tokenizer_config.json)"


def load_tokenizer(path: str) -> Any:
    """The model directory's tokenizer; a ValueError naming model.path when it has none."""
    from transformers import AutoTokenizer  # start-up cost (~1 s): not on the config-error path

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"model.path={path!r}: no usable tokenizer ({type(err).__name__}: {err}); {_FIX}") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer from config.json alone
        raise ValueError(f"model.path={path!r}: no usable tokenizer (it has {len(tokenizer)} token); {_FIX}")
    return tokenizer


def check_vocab(tokenizer: Any, path: str, vocab_size: int) -> None:
    """Every token id of the tokenizer has a row in the model's embedding (``vocab_size``)."""
    if len(tokenizer) > vocab_size:
        raise ValueError(f"model.path={path!r}: the tokenizer has {len(tokenizer)} tokens but config.json "
                         f"vocab_size={vocab_size}; the model cannot score some token ids. Use the tokenizer "
                         "the model was trained with")
