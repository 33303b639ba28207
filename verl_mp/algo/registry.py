"""Name -> function registries for the algorithm extension points.

A `Registry` is a read-only `Mapping` from a name to a function. Built-in entries are
added with the `register(name)` decorator; users plug in their own function without
forking by giving its import path, ``"my_pkg.my_module:my_function"``, wherever a
registered name is accepted (e.g. ``algorithm.adv_estimator`` in the YAML config).
Every function in one registry is called with the same keyword arguments (see the
registry's docstring in `verl_mp.algo`).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name; catchable as either `KeyError` or `ValueError`."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def resolve(path: str) -> Callable[..., Any]:
    """Load a plugin function from ``"package.module:function"``.

    Raises:
        ValueError: the path is malformed, the module cannot be imported, or it has no
            callable attribute of that name. The message says which.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"plugin path {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"cannot import module {module_name!r} for plugin {path!r}: {err}; "
            "is the package installed or on PYTHONPATH?"
        ) from err
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (plugin {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"plugin {path!r} resolves to a {type(obj).__name__}, not a function")
    return obj


class Registry(Mapping[str, Callable[..., Any]]):
    """A mapping from names to functions of one signature.

    ``registry[name]`` returns a registered function, or loads a plugin when `name`
    contains a colon (``"module:function"``). Unknown names raise `UnknownNameError`
    listing the valid ones. Iteration and ``in`` cover registered names only.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator adding `fn` under `name`; duplicate names raise `ValueError`."""

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(name, fn)
            return fn

        return decorator

    def add(self, name: str, fn: Callable[..., Any]) -> None:
        """Register `fn` under `name` (no colon allowed: that marks plugin paths)."""
        if not name or ":" in name:
            raise ValueError(f"{self.kind} name {name!r} must be non-empty and contain no ':'")
        if name in self._fns:
            raise ValueError(f"{self.kind} {name!r} is already registered ({self._fns[name]!r})")
        if not callable(fn):
            raise ValueError(f"{self.kind} {name!r}: {fn!r} is not callable")
        self._fns[name] = fn

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name in self._fns:
            return self._fns[name]
        if isinstance(name, str) and ":" in name:
            return resolve(name)
        valid = ", ".join(sorted(self._fns))
        close = difflib.get_close_matches(str(name), list(self._fns), n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownNameError(
            f"unknown {self.kind} {name!r}; {guess}valid names: {valid}; "
            "or give a plugin as 'package.module:function'"
        )

    def lookup(self, key: str, name: str) -> Callable[..., Any]:
        """``self[name]``; an unknown name or a plugin that does not load raises a ValueError
        naming ``key``, the setting that gave it (``algorithm.adv_estimator='foo': ...``)."""
        try:
            return self[name]
        except (KeyError, ValueError) as err:
            raise ValueError(f"{key}={name!r}: {err}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._fns)})"
