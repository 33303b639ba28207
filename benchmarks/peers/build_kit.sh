#!/usr/bin/env bash
# Builds, on a CPU machine with package-registry access, the peers' kit for the GPU machine
# (Python 3.12, torch 2.11, transformers 5.17, no network): verl 0.9.1 and TRL 1.16.0 as
# released plus what they import that the image and our vLLM 0.26 / Ray 2.60 kits lack
# (requirements.txt), and verl's in-range transformers (requirements-verl-transformers.txt).
# About 20 MB: it travels in one call beside the vLLM kit's second part (README.md here).
# Usage: bash benchmarks/peers/build_kit.sh [OUT=.gpu-peers]   -> OUT/peers-kit/
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.gpu-peers}/peers-kit
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
rm -rf "$out"; mkdir -p "$out/wheels" "$out/verl-transformers"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/wheels" -r "$here/requirements.txt"
# hydra-core 1.3 pins antlr4-python3-runtime 4.9.*, published as a pure-Python sdist only
python3 -m pip wheel -q --no-deps -w "$out/wheels" antlr4-python3-runtime==4.9.3
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out/verl-transformers" -r "$here/requirements-verl-transformers.txt"
cp "$here/install_kit.sh" "$out/install.sh"
du -sh "$out"
