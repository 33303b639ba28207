#!/usr/bin/env bash
# On the GPU machine: install the peers' kit (build_kit.sh) into TARGET/site (verl, TRL and their
# extra packages) and TARGET/verl-transformers (transformers 5.10.4 for verl only).
# Usage: bash install.sh KIT_DIR TARGET     (run.sh's defaults expect TARGET=/tmp/peers)
set -euo pipefail
kit=${1:?usage: install.sh KIT_DIR TARGET} target=${2:?usage: install.sh KIT_DIR TARGET}
pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir)
"${pip[@]}" --target "$target/site" "$kit"/wheels/*.whl
"${pip[@]}" --target "$target/verl-transformers" "$kit"/verl-transformers/*.whl
rm -rf "$target/site/bin" "$target/verl-transformers/bin"
PYTHONPATH="$target/site" python3 -c "import importlib.metadata as m, trl; print('trl', trl.__version__, 'verl', m.version('verl'), 'ready')"  # verl imports ray: checked in its run
