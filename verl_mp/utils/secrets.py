"""What counts as a secret: environment variable names and config keys.

One rule for the reward workers' environment (`verl_mp.reward.worker_proc`) and for the
configuration the trainer writes out (`verl_mp.config.loader`). The name is split into words
at ``_``, ``.`` and ``-``; it is secret-looking when

- a word is a credential word (``SECRET``, ``PASSWORD``, ``CREDENTIALS``, ``APIKEY``, ``AUTH``,
  ...) or the name contains ``ACCESS_KEY``/``PRIVATE_KEY``, or
- its last word is ``TOKEN`` or ``KEY`` and the word before is not a tokenizer or data word
  (``pad_token``, ``eos_token``, ``prompt_key`` are settings, not secrets).

So ``WANDB_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``RAY_AUTH_TOKEN``,
``hub.password`` are secrets; ``max_new_tokens``, ``stop_token_ids``, ``prompt_key``,
``MONKEY`` are not.
"""

from __future__ import annotations

import re

_CREDENTIAL_WORDS = frozenset({
    "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY",
    "AUTH", "COOKIE",
})
_CREDENTIAL_PARTS = ("ACCESS_KEY", "PRIVATE_KEY")
_NOT_SECRET_BEFORE = frozenset({
    "PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "STOP", "START", "END", "SPECIAL", "PROMPT",
    "RESPONSE", "ANSWER", "LABEL", "DATA", "SORT", "CACHE", "DICT", "GROUP",
})
_SPLIT = re.compile(r"[_.\-]+")


def looks_secret(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``WANDB_API_KEY`` or ``trainer.hub_password``."""
    upper = name.upper()
    words = [w for w in _SPLIT.split(upper) if w]
    if any(w in _CREDENTIAL_WORDS for w in words) or any(part in upper for part in _CREDENTIAL_PARTS):
        return True
    if words and words[-1] in ("TOKEN", "KEY"):
        return len(words) == 1 or words[-2] not in _NOT_SECRET_BEFORE
    return False
