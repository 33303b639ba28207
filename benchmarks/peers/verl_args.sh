# verl 0.9.1's GRPO trainer (FSDP2 actor + reference, vLLM rollout) on the peer benchmark's job,
# configured as verl's performance guide recommends for speed on one GPU (README.md here says
# which key follows which advice). Sourced by run.sh: expects WORK, OUT, PROMPTS, N, MAX_NEW,
# STEPS, UTIL, MAX_TOKENS, IGNORE_EOS, HERE; sets VERL_ARGS and VERL_ATTN_PATH.
# Gradient checkpointing: verl's guide says recompute only as needed. On an 80 GB H100 it is
# needed: without it the first update at 18432 tokens per micro-batch ran out of memory
# (2026-12-06: 75.7 GiB allocated by the FSDP worker, benchmarks/RESULTS.md); an H200 needs none.
# VERL_RECOMPUTE=true|false overrides the choice by the card's memory.
# Attention: verl defaults to flash_attention_2, and flash-attn has no wheel for the GPU image's torch
# 2.11 / CUDA 13, so SDPA. With remove padding a micro-batch is one packed row, and transformers 5.10.4
# gives SDPA a dense block-diagonal mask over it (masking_utils: packed position ids, no causal skip):
# every micro-batch of L tokens computes all L x L scores. VERL_ATTN=flex_attention (torch's, compiled
# by transformers, block-sparse over the same mask) is the candidate that skips them; not yet run on a GPU.
# On the CPU (forward only; flex has no CPU backward), transformers 5.19 compiled it twice and then not
# again across 12 training/eval flips and packed lengths of 193-1351 tokens (2026-12-06).
# VERL_ATTN=varlen: torch's own flash-attention varlen kernel over the packed row (FlashAttention-2, the
# kernel family of verl's default), registered with transformers as `peer_varlen` by verl_attn/ (run.sh puts
# it on PYTHONPATH; verl_attn/check_gpu.py checks it against SDPA first). The closest stand-in for verl's default.
# Sets VERL_ATTN_PATH: the PYTHONPATH prefix the chosen attention needs (empty but for varlen).
VERL_ATTN_IMPL=${VERL_ATTN:-sdpa} VERL_ATTN_PATH=""
if [ "$VERL_ATTN_IMPL" = varlen ]; then VERL_ATTN_IMPL=peer_varlen VERL_ATTN_PATH="$HERE/verl_attn:"; fi
if [ -z "${VERL_RECOMPUTE:-}" ]; then
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  VERL_RECOMPUTE=false; [ -n "$mib" ] && [ "$mib" -lt 102400 ] && VERL_RECOMPUTE=true
fi
VERL_ARGS=(
  algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=true algorithm.use_kl_in_reward=false
  "data.train_files=$WORK/data/train.parquet" "data.val_files=$WORK/data/test.parquet"
  data.train_batch_size="$PROMPTS" data.max_prompt_length=64 data.max_response_length="$MAX_NEW"
  data.filter_overlong_prompts=false data.truncation=error data.dataloader_num_workers=0
  actor_rollout_ref.model.path="$WORK/model"
  actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.model.enable_gradient_checkpointing="$VERL_RECOMPUTE"
  +actor_rollout_ref.model.override_config.attn_implementation="$VERL_ATTN_IMPL"
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size="$PROMPTS" actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_TOKENS"
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.2
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.fsdp_config.param_offload=false actor_rollout_ref.actor.fsdp_config.optimizer_offload=false
  actor_rollout_ref.ref.fsdp_config.param_offload=false
  actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$((2 * MAX_TOKENS))
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.n="$N" actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.gpu_memory_utilization="$UTIL"
  actor_rollout_ref.rollout.max_num_seqs=$((PROMPTS * N)) actor_rollout_ref.rollout.max_num_batched_tokens=8192
  actor_rollout_ref.rollout.ignore_eos="$IGNORE_EOS"
  actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$((2 * MAX_TOKENS))
  reward.custom_reward_function.path="$HERE/verl_reward.py" reward.custom_reward_function.name=compute_score
  reward.num_workers=1
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps="$STEPS" trainer.total_epochs=1
  trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=false trainer.resume_mode=disable
  trainer.default_local_dir="$OUT/ckpt" trainer.project_name=peers trainer.experiment_name=verl
  "trainer.logger=[console,file]"
)
