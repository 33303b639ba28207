"""The package's layers (docs/architecture.md): imports point down only, no import cycles.

Every ``import verl_mp...`` statement counts, also those inside functions: a lazy import
is still a dependency.
"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "verl_mp"

LAYERS = {
    "utils": 0,
    "patches": 1,
    "config": 1,
    "kernels": 2,
    "algo": 3,
    "data": 4, "reward": 4, "models": 4,
    "demo": 5,
    "engine": 6,
    "rollout": 7,
    "bridge": 8,
    "plan": 9,
    "workers": 10, "planner": 10,
    "trainer": 11,
    "cli": 12,
}
"""Layer of each package (`verl_mp.<package>`); a module may import its own package and
lower layers. ``trainer`` is imported only by the command line above it."""


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = path
    for path in (ROOT.parent / "patches").glob("*.py"):
        out["verl_mp.patches." + path.stem if path.stem != "__init__" else "verl_mp.patches"] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    """verl_mp modules imported by the file at ``path`` (the longest known prefix)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import submodule` depends on the submodule (the package's __init__ runs
            # first, but a package re-exporting its own modules is no design cycle)
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            names = subs if len(subs) == len(node.names) else [node.module] + subs
        for name in names:
            if not name.startswith("verl_mp"):
                continue
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known:
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(p, set(modules)) - {m} for m, p in modules.items()}


def test_every_package_has_a_layer(graph):
    packages = {_package(m) for m in graph} - {"", "__main__"}
    assert packages <= set(LAYERS), f"add {sorted(packages - set(LAYERS))} to LAYERS (and docs/architecture.md)"


def test_imports_point_down(graph):
    bad = []
    for src, targets in graph.items():
        a = _package(src)
        if a not in LAYERS:
            continue
        for dst in targets:
            b = _package(dst)
            if b in LAYERS and b != a and LAYERS[b] >= LAYERS[a]:
                bad.append(f"{src} -> {dst}")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(sorted(bad))


def test_only_the_command_line_imports_the_trainer(graph):
    bad = [f"{s} -> {d}" for s, ds in graph.items() for d in ds
           if _package(d) == "trainer" and _package(s) not in ("trainer", "cli", "__main__")]
    assert not bad, bad


def test_no_import_cycles(graph):
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative enough for a package of this size)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out
