"""Write docs/configuration.md from the typed schema (verl_mp/config/schema.py and the
dataclasses it nests): every key with its type, default and docstring.

    .venv/bin/python scripts/gen_config_docs.py          # regenerate after a schema change
    .venv/bin/python scripts/gen_config_docs.py --check  # exit 1 if the file is out of date

Field docstrings are the string literals right below a field (PEP 257 attribute
docstrings), read from the source with `ast`; nested dataclasses become dotted keys;
an optional dataclass (``X | None``) is listed with its own keys under the same prefix.
tests/unit/test_config_docs.py fails when docs/configuration.md is not what this writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "configuration.md"

HEADER = """# Configuration reference

Generated from the typed schema by `scripts/gen_config_docs.py` (do not edit by hand: run
`.venv/bin/python scripts/gen_config_docs.py` after changing `verl_mp/config/`;
`tests/unit/test_config_docs.py` fails while this file is out of date).

A run's configuration is `RootConfig` (`verl_mp/config/schema.py`): these defaults, then
a preset from `megatron_configs/` (`--config-name`), then `key=value` overrides on the
command line (`verl_mp/config/loader.py`). Unknown keys and values of the wrong type stop
with an error naming the key; checks that need the model or the world size run in
preflight before any process starts. `verl-mp plan` shows what a configuration costs in
GPU memory. Types are Python annotations; `None` is `null` in YAML.
"""


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    sys.path.insert(0, str(REPO))
    from verl_mp.config.reference import rows
    from verl_mp.config.schema import RootConfig

    hints = typing.get_type_hints(RootConfig)
    parts = [HEADER]
    for f in dataclasses.fields(RootConfig):
        section = hints[f.name]
        doc = inspect.cleandoc(section.__doc__ or "") if section.__doc__ and not section.__doc__.startswith(
            section.__name__ + "(") else ""
        parts.append(f"\n## `{f.name}` ({section.__name__})\n")
        if doc:
            parts.append(doc + "\n")
        parts.append("| key | type | default | description |\n|---|---|---|---|")
        for key, tp, default, text in rows(section, f.name + ".", getattr(RootConfig(), f.name)):
            parts.append(f"| `{key}` | `{cell(tp)}` | {cell(default)} | {cell(text)} |")
    return "\n".join(parts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is out of date")
    args = ap.parse_args()
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run .venv/bin/python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
