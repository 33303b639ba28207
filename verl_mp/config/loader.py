"""Load a run configuration: defaults (schema.py) <- preset YAML <- CLI dotlist."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from verl_mp.config.schema import RootConfig

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
    """Merge and type-check; unknown keys and wrong types raise ValueError naming the key."""
    merged = OmegaConf.structured(RootConfig)
    try:
        if config_name:
            merged = OmegaConf.merge(merged, OmegaConf.load(preset_path(config_name)))
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        return OmegaConf.to_object(merged)
    except (ConfigKeyError, ConfigAttributeError) as exc:
        raise ValueError(f"unknown config key: {_key_of(exc)}; {_valid_keys_hint(exc)}") from None
    except ValidationError as exc:
        raise ValueError(f"invalid config value for {_key_of(exc)}: {exc.msg}") from None


def _key_of(exc) -> str:
    return str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or exc)


def _valid_keys_hint(exc) -> str:
    full_key = str(getattr(exc, "full_key", "") or "")
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    node = OmegaConf.structured(RootConfig)
    try:
        section = OmegaConf.select(node, parent) if parent else node
        return f"valid keys under '{parent or '<root>'}': {sorted(section.keys())}"
    except Exception:  # the hint is best effort; the error itself already names the key
        return "see verl_mp/config/schema.py"


def to_yaml(cfg: RootConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
