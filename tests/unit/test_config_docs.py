"""docs/configuration.md is what scripts/gen_config_docs.py writes from the typed schema,
and it names every key of the schema with its default."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from verl_mp.config.schema import RootConfig

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", REPO / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def leaf_keys(obj, prefix=""):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaf_keys(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def test_configuration_md_is_up_to_date():
    text = (REPO / "docs" / "configuration.md").read_text()
    assert text == generator().render(), \
        "docs/configuration.md is out of date: run .venv/bin/python scripts/gen_config_docs.py"


def test_every_key_and_default_is_listed():
    text = (REPO / "docs" / "configuration.md").read_text()
    for key, value in leaf_keys(RootConfig()):
        row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        assert f"`{value!r}`" in row, (key, value, row)
    # documented fields carry their docstrings
    assert "Prompts per RL step" in text and "vLLM sleep level while training" in text
