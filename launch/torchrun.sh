#!/usr/bin/env bash
# One machine, no Ray: validate + resolve the config, then torchrun the SPMD trainer.
#   NPROC=8 bash launch/torchrun.sh --config-name grpo model.path=/ckpt/Qwen2.5-7B-Instruct \
#       data.train_files=[/data/gsm8k/train.parquet] actor.megatron.tensor_model_parallel_size=4
set -euo pipefail
PYTHON=${PYTHON:-python}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}
# The arguments first: `train` takes its options (--config-name) before the dotlist overrides,
# and argparse refuses options after a first group of overrides. Ours come last and win.
exec "$PYTHON" -m verl_mp train "$@" trainer.launcher=torchrun trainer.nproc="${NPROC:-1}"
