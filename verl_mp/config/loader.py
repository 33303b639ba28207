"""Load a run configuration: defaults (schema.py) <- preset YAML <- CLI dotlist.

Secrets: a value given as ``${oc.env:NAME}`` is resolved for the run but written out
(`to_yaml`: the log, the saved ``config.yaml``, checkpoints, TensorBoard/W&B) as the
reference ``${oc.env:NAME}``, never as its value; ranks that read ``config.yaml`` resolve it
from their own (inherited) environment. Every other interpolation is written as written too
(``b: ${a}`` stays ``${a}``), so a secret cannot reach the file through a chain of them. A
config field whose name looks like a secret (`verl_mp.utils.secrets.looks_secret`) must come
from the environment, directly or through such a chain: a literal value is refused.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from verl_mp.config.keys import is_former_default, removed_key_reason, unknown_key_message
from verl_mp.config.schema import RootConfig
from verl_mp.utils.errors import ConfigErrors
from verl_mp.utils.secrets import looks_secret

PRESET_DIR = Path(__file__).resolve().parents[2] / "megatron_configs"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """A preset name (``grpo``) or a path to a YAML file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = PRESET_DIR / f"{name}.yaml"
    if not candidate.exists():
        raise ValueError(f"--config-name={name!r}: no such preset; valid presets: {list_presets()} "
                         f"(or give a path to a .yaml file)")
    return candidate


def load_config(config_name: str | None = None, overrides: list[str] | None = None) -> RootConfig:
    """Merge and type-check; unknown keys and wrong types raise ValueError naming the key,
    the value, the expected type and an example (`ConfigErrors`: every such mistake at once).
    A single string is accepted where the schema wants a list
    (``data.train_files=/data/train.parquet``)."""
    cfg, errors = load_config_checked(config_name, overrides)
    if errors:
        raise ConfigErrors(errors)
    return cfg


def load_config_checked(config_name: str | None = None,
                        overrides: list[str] | None = None) -> tuple[RootConfig | None, list[str]]:
    """`load_config` without raising: the configuration built from every valid setting (None
    when even that fails) and one message per invalid one (unknown key, wrong type, a value a
    section refuses, a key that does nothing), so that a user sees all mistakes at once."""
    schema = OmegaConf.structured(RootConfig)
    errors: list[str] = []
    layers = []
    if config_name:
        try:
            layers.append(OmegaConf.load(preset_path(config_name)))
        except ValueError as err:
            return None, [str(err)]
    if overrides:
        good = [item for item in overrides if "=" in item]
        errors += [f"override {item!r} must look like key=value (e.g. trainer.total_steps=10)"
                   for item in overrides if "=" not in item]
        if good:
            layers.append(OmegaConf.from_dotlist(good))
    merged = schema
    for layer in layers:
        merged = _merge_valid(schema, merged, _lists_from_strings(schema, layer), errors)
    try:
        interpolations = _interpolations(merged)
        cfg = OmegaConf.to_object(merged)
        _refuse_literal_secrets(cfg, (), _from_environment(interpolations))
    except (OmegaConfBaseException, ValueError) as exc:
        return None, errors + [_message(schema, exc, "")]
    _INTERPOLATIONS.update(interpolations)
    return cfg, errors


def _merge_valid(schema, merged, layer, errors: list[str]):
    """``merged`` with ``layer`` on top; where that fails, leaf by leaf, keeping the valid
    settings and one message per invalid one in ``errors``. Removed keys (`verl_mp.config.keys`)
    are dropped: silently at their former default (a config.yaml of older code), else with a
    message."""
    leaves = _leaves(OmegaConf.to_container(layer, resolve=False))
    removed = [(path, value) for path, value in leaves if removed_key_reason(".".join(path))]
    errors += [f"{'.'.join(p)} does nothing: {removed_key_reason('.'.join(p))}; remove it"
               for p, value in removed if not is_former_default(".".join(p), value)]
    if removed:
        leaves = [(path, value) for path, value in leaves if not removed_key_reason(".".join(path))]
        plain: dict = {}
        for path, value in leaves:
            node = plain
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        layer = OmegaConf.create(plain)
    try:
        candidate = OmegaConf.merge(merged, layer)
        OmegaConf.to_object(candidate)
        return candidate
    except (OmegaConfBaseException, ValueError):
        pass
    for path, value in leaves:
        try:
            candidate = OmegaConf.merge(merged, OmegaConf.create(_nested(path, value)))
            OmegaConf.to_object(candidate)
        except (OmegaConfBaseException, ValueError) as exc:
            errors.append(_message(schema, exc, ".".join(path)))
            continue
        merged = candidate
    return merged


def _leaves(plain: dict, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, value) of every setting of a plain nested dict; lists and empty dicts are values."""
    found = []
    for key, value in plain.items():
        if isinstance(value, dict) and value:
            found += _leaves(value, path + (str(key),))
        else:
            found.append((path + (str(key),), value))
    return found


def _nested(path: tuple, value: Any) -> dict:
    node: Any = value
    for part in reversed(path):
        node = {part: node}
    return node


def _message(schema, exc: Exception, key: str) -> str:
    """One line for what ``exc`` says about ``key`` (the setting being merged; "" if unknown)."""
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        return unknown_key_message(key or _key_of(exc))
    if isinstance(exc, ValidationError):
        return _invalid_value_message(schema, exc)
    if isinstance(exc, ValueError):
        return str(exc)
    return f"{key or _key_of(exc)}: {str(exc).splitlines()[0]}"


def _lists_from_strings(schema, node):
    """Where the schema has a list and ``node`` a single scalar, make it a one-item list."""
    plain = OmegaConf.to_container(node, resolve=False)

    def walk(value, path):
        if isinstance(value, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        if not isinstance(value, (list, dict)) and value is not None and \
                isinstance(OmegaConf.select(schema, path, default=None), ListConfig):
            return [value]
        return value

    return OmegaConf.create(walk(plain, ""))


def _invalid_value_message(schema, exc: ValidationError) -> str:
    key = _key_of(exc)
    reason = str(getattr(exc, "msg", exc)).splitlines()[0]
    hint = ""
    leaf = key.rsplit(".", 1)[-1]
    owner = getattr(exc, "object_type", None)
    if owner is not None and dataclasses.is_dataclass(owner):
        hints = typing.get_type_hints(owner)
        if leaf in hints:
            hint = f"; expected {_type_name(hints[leaf])}"
    default = OmegaConf.select(schema, key, default=None, throw_on_missing=False)
    if default is not None:
        shown = OmegaConf.to_container(default) if isinstance(default, (ListConfig, DictConfig)) else default
        example = "[" + ",".join(map(str, shown)) + "]" if isinstance(shown, list) else shown
        hint += f" (default {shown!r}; e.g. {key}={example})"
    return f"invalid value for {key}: {reason}{hint}"


def _type_name(tp) -> str:
    name = getattr(tp, "__name__", None)
    return name if name and not getattr(tp, "__args__", None) else str(tp).replace("typing.", "")


_INTERPOLATIONS: dict[tuple, tuple[str, Any]] = {}
"""Every config path loaded in this process whose value is an interpolation (``${oc.env:...}``,
``${a.b}``, ``p-${x}``): path -> (the text as written, the value it resolved to). `to_yaml`
writes the text wherever the value is unchanged."""

_NODE_REFERENCE = re.compile(r"\$\{(\.*[A-Za-z_][\w.\[\]]*)\}")
"""``${a.b}``, ``${.sibling}``, ``${..x}``: a reference to another node (not a resolver call)."""


def _interpolations(merged) -> dict[tuple, tuple[str, Any]]:
    """Paths whose raw value is an interpolation, with the raw text and the resolved value."""
    found: dict[tuple, tuple[str, Any]] = {}

    def walk(raw: Any, path: tuple) -> None:
        if isinstance(raw, dict):
            for key, value in raw.items():
                walk(value, path + (key,))
        elif isinstance(raw, list):
            for i, value in enumerate(raw):
                walk(value, path + (i,))
        elif isinstance(raw, str) and "${" in raw:
            value = _select(merged, path)
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
            found[path] = (raw, value)

    walk(OmegaConf.to_container(merged, resolve=False), ())
    return found


def _from_environment(interpolations: dict[tuple, tuple[str, Any]]) -> set[tuple]:
    """The paths whose value comes from ``oc.env``, directly or through references to other
    interpolated nodes (``b: ${a}`` with ``a: ${oc.env:S}``)."""
    raw = {path: text for path, (text, _value) in interpolations.items()}

    def target(path: tuple, ref: str) -> tuple:
        dots = len(ref) - len(ref.lstrip("."))
        parts = tuple(p for p in ref.lstrip(".").replace("[", ".").replace("]", "").split(".") if p)
        base = path[:-dots] if dots else ()  # ${.x}: a sibling; ${..x}: the parent's sibling
        return base + parts

    def from_env(path: tuple, seen: frozenset) -> bool:
        text = raw.get(path)
        if text is None:
            return False
        if "oc.env" in text:
            return True
        for ref in _NODE_REFERENCE.findall(text):
            node = target(path, ref)
            below = [p for p in raw if p[:len(node)] == node and p not in seen]
            if any(from_env(p, seen | {p}) for p in below):
                return True
        return False

    return {path for path in raw if from_env(path, frozenset({path}))}


def _select(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node


def _refuse_literal_secrets(cfg: Any, path: tuple, from_env: set | dict) -> None:
    """A dataclass field that looks secret must come from the environment (``from_env``: the
    paths that do, `_from_environment`), not from the YAML/CLI."""
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), path + (f.name,)
        if dataclasses.is_dataclass(value):
            _refuse_literal_secrets(value, key, from_env)
        elif looks_secret(f.name) and isinstance(value, str) and value and key not in from_env:
            dotted = ".".join(map(str, key))
            raise ValueError(f"{dotted} holds a literal secret; configs are saved and logged, so pass "
                             f"it from the environment: {dotted}='${{oc.env:YOUR_VARIABLE}}'")


def _key_of(exc) -> str:
    return str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or exc)


def to_yaml(cfg: RootConfig) -> str:
    """The config as YAML, with interpolations (``${oc.env:...}``, ``${a.b}``) as written in
    place of their values."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg))
    for path, (raw, resolved) in _INTERPOLATIONS.items():
        try:
            parent = _select(container, path[:-1])
            if parent[path[-1]] == resolved:
                parent[path[-1]] = raw
        except (KeyError, IndexError, TypeError):
            continue  # a path of another config loaded in this process
    return OmegaConf.to_yaml(OmegaConf.create(container))
