#!/usr/bin/env bash
# Ray single controller on this machine (starts a local Ray, or joins RAY_ADDRESS if set).
#   NPROC=8 bash launch/ray.sh --config-name ppo model.path=... data.train_files=[...]
set -euo pipefail
PYTHON=${PYTHON:-python}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}
# The arguments first: `train` takes its options (--config-name) before the dotlist overrides,
# and argparse refuses options after a first group of overrides. Ours come last and win.
exec "$PYTHON" -m verl_mp train "$@" trainer.launcher=ray trainer.nproc="${NPROC:-1}"
