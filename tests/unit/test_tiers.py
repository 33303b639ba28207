"""Every test module declares its tier, and the fast test command is the one CI runs.

Tiers are pytest markers registered in pyproject.toml (docs/testing.md): ``unit``, ``dist``,
``e2e``, ``gpu`` say what a test needs; ``smoke`` marks the few end-to-end tests that run
with ``unit`` in README's fast command. A module without a tier marker would run in no
tier's selection (``-m unit`` etc.) and silently drop out of the fast set or of CI's rest.
"""

import ast
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TIERS = ("unit", "dist", "e2e", "gpu")


def _registered_markers() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0].strip() for m in config["markers"]}


def _module_marks(path: Path) -> set[str]:
    """Marker names in the module-level ``pytestmark`` (``pytest.mark.X`` anywhere in its value)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            return {n.attr for n in ast.walk(node.value)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                    and n.value.attr == "mark"}
    return set()


def test_tiers_and_smoke_are_registered():
    assert {*TIERS, "smoke"} <= _registered_markers()


def test_every_test_module_declares_its_tier():
    modules = sorted((REPO / "tests").rglob("test_*.py"))
    assert len(modules) > 50
    missing = [str(p.relative_to(REPO)) for p in modules if not _module_marks(p) & set(TIERS)]
    assert not missing, f"test modules without a tier marker in pytestmark ({', '.join(TIERS)}): {missing}"


def _fast_command() -> str:
    match = re.search(r"^TEST_CMD='(.+)'$", (REPO / ".ci" / "run").read_text(), re.M)
    assert match, ".ci/run no longer defines TEST_CMD"
    return match.group(1)


def test_readme_shows_the_fast_command_ci_runs_and_the_full_one():
    readme = (REPO / "README.md").read_text().splitlines()
    fast = _fast_command()
    assert fast in readme and "-m \"unit or smoke\"" in fast, fast
    assert ".venv/bin/python -m pytest -q" in readme  # the full suite, one command
