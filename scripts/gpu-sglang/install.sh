#!/usr/bin/env bash
# On the GPU machine: join the parts found in PARTS_DIR, unpack, install the extra wheels, and
# print the PYTHONPATH line (the kit's torch 2.14.1 shadows the image's 2.11; the image's CUDA 13
# libraries stay). Usage: install.sh PARTS_DIR TARGET_DIR
set -euo pipefail
parts=${1:?usage: install.sh PARTS_DIR TARGET_DIR}; target=${2:?usage: install.sh PARTS_DIR TARGET_DIR}
mkdir -p "$target"
cat "$parts"/kit.tar.xz.part* | xz -d -c | tar -x -C "$target" --strip-components=1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$target/site" "$target"/wheels/*.whl
rm -rf "$target/site/bin"
PYTHONPATH="$target/site" python3 -c "import torch, sgl_kernel, sglang; print('torch', torch.__version__, 'sglang', sglang.__version__, 'ready')"
echo "export PYTHONPATH=$target/site HF_HUB_OFFLINE=1"
