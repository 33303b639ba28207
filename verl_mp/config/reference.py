"""The configuration's own reference: every key with its type, default and docstring.

Field docstrings are the string literals right below a field (attribute docstrings), read
from the source with `ast`. Used by `scripts/gen_config_docs.py` (docs/configuration.md)
and by `verl-mp config show` (a resolved configuration with the docstrings).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass and its bases: ``{field: docstring}``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:] + [None], strict=True):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) \
                    and isinstance(nxt.value.value, str):
                docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def type_name(tp) -> str:
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def nested_dataclass(tp) -> type | None:
    """The dataclass a field holds (also inside ``X | None``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def fmt_default(value) -> str:
    if dataclasses.is_dataclass(value):
        return "(section)"
    if isinstance(value, str):
        return f"`{value!r}`" if value else "`''`"
    return f"`{value!r}`"


def rows(cls: type, prefix: str = "", values=None) -> list[tuple[str, str, str, str]]:
    """(key, type, default, doc) for every key of ``cls``; defaults are read from
    ``values`` (the default instance of the enclosing field: e.g. ``ref`` is built with
    ``offload=True``), else from the class."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    values = values if values is not None else cls()
    out = []
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        sub = nested_dataclass(tp)
        default = getattr(values, f.name)
        doc = docs.get(f.name, "")
        if sub is not None and dataclasses.is_dataclass(default):
            if doc:
                out.append((key, type_name(tp), "(section)", doc))
            out += rows(sub, key + ".", default)
        elif sub is not None:  # an optional section, null by default: its keys when set
            out.append((key, type_name(tp), fmt_default(default), doc))
            out += rows(sub, key + ".")
        else:
            out.append((key, type_name(tp), fmt_default(default), doc))
    return out


def resolved_rows(cfg) -> list[tuple[str, str, str, str]]:
    """(key, type, value, doc) of a resolved `RootConfig` instance."""
    return rows(type(cfg), "", cfg)
