#!/usr/bin/env bash
# On the GPU machine: join the parts found in PARTS_DIR, unpack them into TARGET_DIR, check that the
# kit imports against the image's torch 2.11 (sgl_kernel's sm90 library, the engine module), and print
# the PYTHONPATH line. The kit's site goes FIRST on PYTHONPATH: its transformers 5.12.1 / tokenizers
# 0.22.2 replace the image's 5.17 / 0.23.2 for the whole process (sglang 0.5.17 fails to import under
# 5.17; scripts/gpu-sglang/requirements.txt says why). Usage: install.sh PARTS_DIR TARGET_DIR
set -euo pipefail
parts=${1:?usage: install.sh PARTS_DIR TARGET_DIR}; target=${2:?usage: install.sh PARTS_DIR TARGET_DIR}
mkdir -p "$target"
cat "$parts"/kit.tar.xz.part* | xz -d -T0 -c | tar -x -C "$target" --strip-components=1
PYTHONPATH="$target/site" SGLANG_IS_FLASHINFER_AVAILABLE=false python3 - <<'PY'
import torch, transformers, sgl_kernel, sglang
import sgl_kernel.load_utils  # noqa: F401
from sglang.srt.entrypoints.engine import Engine  # noqa: F401
print("torch", torch.__version__, "transformers", transformers.__version__, "sglang", sglang.__version__,
      "sgl_kernel", sgl_kernel.__version__, "cc", torch.cuda.get_device_capability(), "ready")
PY
echo "export PYTHONPATH=$target/site HF_HUB_OFFLINE=1 SGLANG_IS_FLASHINFER_AVAILABLE=false"
