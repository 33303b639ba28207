"""Add ``--hash=sha256:...`` to every pin of a lock file, from the files pip downloads.

    python scripts/lock_hashes.py requirements/cpu-lock.txt [pip download options...]

Each ``name==version`` line (existing hashes are dropped) is downloaded with
``pip download --no-deps`` into an empty temporary directory, using this interpreter and
the pip options given (e.g. ``--extra-index-url https://download.pytorch.org/whl/cpu``), so
the hash is of the very file ``pip install`` picks on this platform. Comment lines stay.
The file is rewritten in place; a pin pip cannot download stops the script.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename


def read_pins(path: Path) -> tuple[list[str], list[str]]:
    """(comment lines at the top, ``name==version`` pins) of a lock file."""
    header, pins = [], []
    for line in path.read_text().splitlines():
        text = line.strip().rstrip("\\").strip()
        if not text or text.startswith("--hash"):
            continue
        if text.startswith("#"):
            header.append(line)
        else:
            pins.append(text.split()[0])
    return header, pins


def _name_version(filename: str) -> tuple[str, str]:
    if filename.endswith(".whl"):
        name, version, _build, _tags = parse_wheel_filename(filename)
    else:
        name, version = parse_sdist_filename(filename)
    return canonicalize_name(name), str(version)


def hashes_of(pins: list[str], pip_args: list[str]) -> dict[str, str]:
    """canonical name -> sha256 of the file pip downloads for its pin."""
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "pins.txt"
        reqs.write_text("\n".join(pins) + "\n")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, "-r", str(reqs),
                        *pip_args], check=True)
        reqs.unlink()
        return hash_files(Path(tmp))


def hash_files(directory: Path) -> dict[str, str]:
    """canonical name -> sha256 of each wheel/sdist in ``directory``."""
    found = {}
    for file in sorted(directory.iterdir()):
        name, _version = _name_version(file.name)
        found[name] = hashlib.sha256(file.read_bytes()).hexdigest()
    return found


def main(argv: list[str]) -> None:
    path, pip_args = Path(argv[0]), argv[1:]
    header, pins = read_pins(path)
    write_lock(path, header, pins, hashes_of(pins, pip_args))


def write_lock(path: Path, header: list[str], pins: list[str], found: dict[str, str]) -> None:
    lines = list(header)
    for pin in pins:
        name = canonicalize_name(pin.split("==")[0])
        if name not in found:
            raise SystemExit(f"lock_hashes: pip downloaded no file for {pin}")
        lines.append(f"{pin} \\\n    --hash=sha256:{found[name]}")
    path.write_text("\n".join(lines) + "\n")
    print(f"lock_hashes: {len(pins)} pins hashed in {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
