"""The package's layers (docs/architecture.md): imports point down only, no import cycles,
no check written in two layers, no config key that reaches no code.

Every ``import verl_mp...`` statement counts, also those inside functions: a lazy import
is still a dependency.
"""

import ast
import re
from collections import defaultdict
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


# -- checks in one place, keys that reach code ------------------------------------------------------
DELIBERATE_REPEATS = {
    "needs rollout backend vllm": "the rollout builder refuses what it cannot build when called on its own "
                                  "(tests, benchmarks); preflight names the key first. Also shared wording of "
                                  "different checks (multi-turn, local sync)",
    "is not one of": "make_weight_sync is also called on its own (benchmarks/weight_sync.py)",
    "needs attention_backend 'sdpa' or 'te'": "the engine checks the backend it resolved (auto -> te/sdpa); "
                                              "the config checks the key as written",
    "mixture of experts model": "different checks (an expert layout, routing replay, routing capture) in the "
                                "layer that owns each; shared wording",
    "at module level in an importable module": "wording shared by the pickling checks of reward functions and tools",
    "must look like 'package module function'": "the two registries (algorithms, rewards) parse their own plugins",
}
"""Phrases of ValueError messages found in more than one package on purpose, and why. A new
repeat is a check duplicated across layers: keep it in the layer that owns the setting."""


def _message_text(node) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message_text(node.left) + _message_text(node.right)
    return " {} "


def _value_error_messages() -> list[tuple[str, str, str]]:
    """(package, file:line, message words) of every ``raise ValueError(...)`` in verl_mp."""
    out = []
    for path in ROOT.rglob("*.py"):
        if "patches" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args \
                    and getattr(node.exc.func, "id", None) == "ValueError":
                words = " ".join(re.findall(r"[a-z_']+", _message_text(node.exc.args[0]).lower()))
                out.append((path.relative_to(ROOT).parts[0], f"{path.relative_to(ROOT.parent)}:{node.lineno}", words))
    return out


def test_no_check_is_duplicated_across_layers():
    """Two messages of different packages sharing six words in a row are one check written twice
    (issue 42: remove_padding with local attention was written three times), unless listed."""
    where = defaultdict(set)
    for package, place, words in _value_error_messages():
        if any(phrase in words for phrase in DELIBERATE_REPEATS):
            continue
        split = words.split()
        for i in range(len(split) - 5):
            where[" ".join(split[i:i + 6])].add((package, place))
    repeats = {shingle: sorted(p for _, p in found) for shingle, found in where.items()
               if len({package for package, _ in found}) > 1}
    assert not repeats, f"the same check in several layers (keep it where the setting is owned): {repeats}"


def test_every_config_key_reaches_code():
    """Every leaf key of the run configuration is read by name somewhere outside verl_mp/config
    (a coarse test: by field name): a key that does nothing is removed from the schema
    (`verl_mp.config.keys.REMOVED_KEYS` refuses it when set)."""
    from verl_mp.config.keys import schema_keys

    read = set()
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                read.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                read.add(node.value)  # getattr(section, "name"), ("train_files", "val_files")
            elif isinstance(node, ast.keyword) and node.arg:
                read.add(node.arg)
    keys = schema_keys()
    leaves = [k for k in keys if not any(other.startswith(k + ".") for other in keys)]
    unread = [k for k in leaves if k.rsplit(".", 1)[-1] not in read]
    assert not unread, f"config keys no code reads (remove them, and list them in REMOVED_KEYS): {unread}"
