"""What counts as a secret: environment variable names and config keys.

One rule for the reward workers' environment (`verl_mp.reward.worker_proc`) and for the
configuration the trainer writes out (`verl_mp.config.loader`): a name is secret-looking when
one of its ``_``/``.``/``-``-separated words is a credential word (``TOKEN``, ``SECRET``,
``PASSWORD``, ``CREDENTIALS``, ``KEY`` ...), or it contains ``API_KEY``/``APIKEY``/
``ACCESS_KEY``/``PRIVATE_KEY``. Words, not substrings: ``max_new_tokens``, ``pad_token_id`` and
``MONKEY`` are not secrets; ``WANDB_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``RAY_AUTH_TOKEN`` and ``hub.password`` are.
"""

from __future__ import annotations

import re

_SECRET_WORDS = frozenset({
    "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS",
    "KEY", "APIKEY", "AUTH", "COOKIE",
})
_SECRET_PARTS = ("API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY", "SECRET")
_SPLIT = re.compile(r"[_.\-]+")

REDACTED = "<redacted>"


def looks_secret(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``WANDB_API_KEY`` or ``trainer.hub_password``."""
    upper = name.upper()
    words = _SPLIT.split(upper)
    return any(w in _SECRET_WORDS for w in words) or any(part in upper for part in _SECRET_PARTS)
