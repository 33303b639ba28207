"""The configuration's keys: every valid dotted key, the closest one to a typo, and the keys
that were removed from the schema because they did nothing (refused when set, tolerated at
their former default in a ``config.yaml`` that older code saved)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl_mp.config.engine import EngineSettings
from verl_mp.config.schema import RootConfig

_REF_FROZEN = "the reference policy is frozen (a forward pass per step: no optimizer, no backward)"
REMOVED_KEYS = {
    "ref.optim": _REF_FROZEN,
    "ref.offload.grads": _REF_FROZEN + ", so it has no gradients",
    "ref.offload.optimizer": _REF_FROZEN,
    "ref.recompute": _REF_FROZEN + ", so nothing is recomputed",
    "ref.recompute_modules": _REF_FROZEN + ", so nothing is recomputed",
    "ref.recompute_num_layers": _REF_FROZEN + ", so nothing is recomputed",
}
"""Keys (or sections) that the ``ref`` section had, shared with the trained roles, but that
reached no code: setting one is an error naming why (`verl_mp.config.loader`). A config.yaml
saved by older code holds each at its default (the `EngineSettings` default of the same
field), which is dropped without a word."""


def removed_key_reason(key: str) -> str | None:
    """Why ``key`` (dotted) was removed, or None when it was not."""
    for removed, reason in REMOVED_KEYS.items():
        if key == removed or key.startswith(removed + "."):
            return reason
    return None


def is_former_default(key: str, value: Any) -> bool:
    """Whether ``value`` is the default a removed ``ref.*`` key had (that of `EngineSettings`)."""
    default = OmegaConf.select(OmegaConf.structured(EngineSettings), key.split(".", 1)[1], default=None)
    if isinstance(default, (DictConfig, ListConfig)):
        default = OmegaConf.to_container(default)
    return value == default


def _dataclass_of(tp) -> type | None:
    """The dataclass of a field type (``X`` or ``X | None``), or None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def _keys(cls: type, prefix: str) -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        inner = _dataclass_of(hints[f.name])
        if inner is not None:
            keys += _keys(inner, key + ".")
    return keys


@functools.cache
def schema_keys() -> tuple[str, ...]:
    """Every dotted key of `RootConfig`, sections included (``actor``, ``actor.optim``, ...)."""
    return tuple(_keys(RootConfig, ""))


def closest_key(key: str) -> str | None:
    """The valid key a typo most likely meant: the closest sibling under the longest valid
    parent, else the closest key anywhere; None when nothing is close."""
    keys = schema_keys()
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        parent = ".".join(parts[:depth])
        if depth and parent not in keys:
            continue
        prefix = parent + "." if parent else ""
        siblings = [k[len(prefix):] for k in keys if k.startswith(prefix) and "." not in k[len(prefix):]]
        match = difflib.get_close_matches(parts[depth], siblings, n=1, cutoff=0.6)
        guess = ".".join([prefix + match[0], *parts[depth + 1:]]) if match else None
        if guess in keys:
            return guess
        if depth:
            return None  # the section is right; nothing in it is close
        break
    match = difflib.get_close_matches(key, [k for k in keys if k.count(".") == key.count(".")], n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_key_message(key: str) -> str:
    """``unknown config key: K; did you mean C?`` (or the valid keys of its section)."""
    reason = removed_key_reason(key)
    if reason:
        return f"{key} does nothing: {reason}; remove it"
    guess = closest_key(key)
    if guess and guess in schema_keys():
        return f"unknown config key: {key}; did you mean {guess}? (`verl-mp config show` lists every key)"
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    while parent and parent not in schema_keys():
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    prefix = parent + "." if parent else ""
    valid = sorted(k[len(prefix):] for k in schema_keys() if k.startswith(prefix) and "." not in k[len(prefix):])
    return f"unknown config key: {key}; valid keys under '{parent or '<root>'}': {valid}"
