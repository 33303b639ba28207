#!/usr/bin/env bash
# A short GRPO run of the real trainer (torchrun launcher, Megatron + colocated vLLM) on one
# GPU, for step-time numbers: a random Qwen2-0.5B-shaped model (hidden 896, 24 layers,
# 14 heads / 2 KV heads, FFN 4864) with the project's tiny tokenizer (so a 117-token
# vocabulary: the LM head is negligible, unlike the real 151936), on the synthetic
# arithmetic prompts. A random model writes until max_new_tokens, so every response is full
# length. Usage: bash benchmarks/gpu_grpo.sh OUT_DIR   (PYTHONPATH with verl_mp, vLLM 0.26)
set -euo pipefail
out=${1:?usage: gpu_grpo.sh OUT_DIR}
work=$(mktemp -d)
python3 - "$work" <<'PY'
import sys, torch
from verl_mp.data.synthetic import write_synthetic_dataset
from verl_mp.models.tiny import save_tiny_qwen2
work = sys.argv[1]
write_synthetic_dataset(f"{work}/data", num_train=2048, num_test=64, seed=0)
save_tiny_qwen2(f"{work}/model", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                intermediate_size=4864, max_position_embeddings=1024, dtype=torch.bfloat16)
PY
python3 -m verl_mp.trainer.main --config-name grpo \
  model.path="$work/model" model.dtype=bf16 \
  "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]" \
  data.train_batch_size=64 data.max_prompt_length=64 \
  actor.ppo_mini_batch_size=64 actor.micro_batch_size=32 ref.micro_batch_size=32 \
  rollout.tensor_model_parallel_size=1 rollout.max_model_len=512 rollout.gpu_memory_utilization=0.4 \
  rollout.sampling.n=8 rollout.sampling.max_new_tokens=256 \
  trainer.launcher=torchrun trainer.nproc=1 trainer.total_steps=4 trainer.test_freq=0 \
  trainer.val_before_train=false trainer.save_final=false trainer.export_hf_at_end=false \
  trainer.peak_tflops=989 "trainer.logger=[console,jsonl]" trainer.default_local_dir="$out"
