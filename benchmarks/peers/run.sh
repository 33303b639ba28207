#!/usr/bin/env bash
# One system on the peer benchmark's GRPO job (README.md here): verl_mp, verl or trl, on the
# same model and prompts (prepare.py, written once into WORK), one GPU.
#
# Usage: bash benchmarks/peers/run.sh PEER OUT_DIR      PEER: verl_mp | verl_mp_defaults | verl | trl
#   (verl_mp_anchor: verl_mp's tuned run again, beside a peer that ran on another machine)
# Job (env, defaults): SIZE=1.5b VOCAB=tiny PROMPTS=64 N=8 MAX_NEW=1024 STEPS=5 UTIL=0.4
#   MAX_TOKENS=18432 (token budget per micro-batch: verl_mp and verl) MICRO=32 (rows per
#   micro-batch: TRL, which has no token budget) IGNORE_EOS=false WORK=/tmp/peers_work
#   DTYPE=bf16 (fp32 + CPU=1 for a CPU dry run of trl/verl_mp) PYTHON=python3
#   TRL_MODEL_DTYPE=float32 (TRL's own default: fp32 weights under bf16 autocast; bfloat16: a pure bf16
#   trainer like verl_mp's, for a like-for-like log-prob gap)
# Where each system's packages are (PYTHONPATH pieces; defaults are the GPU session's):
#   MEGATRON_SITE=/tmp/site (megatron-core, omegaconf 2.4)  VLLM_SITE=~/vllm026/site
#   RAY_SITE=/tmp/raysite  PEERS_SITE=/tmp/peers/site  VERL_TF_SITE=/tmp/peers/verl-transformers
# Writes OUT_DIR/<peer>.log, the system's own metrics (verl_mp: metrics.jsonl; verl: metrics.jsonl
# through its file logger; trl: steps.jsonl), gpu_mem.csv (nvidia-smi every 0.5 s) and job.json.
set -euo pipefail
peer=${1:?usage: run.sh verl_mp|verl|trl OUT_DIR}
out=${2:?usage: run.sh verl_mp|verl|trl OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$HERE/../.." && pwd)
SIZE=${SIZE:-1.5b} VOCAB=${VOCAB:-tiny} PROMPTS=${PROMPTS:-64} N=${N:-8} MAX_NEW=${MAX_NEW:-1024}
STEPS=${STEPS:-5} UTIL=${UTIL:-0.4} MAX_TOKENS=${MAX_TOKENS:-18432} MICRO=${MICRO:-32}
IGNORE_EOS=${IGNORE_EOS:-false} WORK=${WORK:-/tmp/peers_work} DTYPE=${DTYPE:-bf16} PY=${PYTHON:-python3}
MEGATRON_SITE=${MEGATRON_SITE:-/tmp/site} VLLM_SITE=${VLLM_SITE:-$HOME/vllm026/site} RAY_SITE=${RAY_SITE:-/tmp/raysite}
PEERS_SITE=${PEERS_SITE:-/tmp/peers/site} VERL_TF_SITE=${VERL_TF_SITE:-/tmp/peers/verl-transformers}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$out"
out=$(cd "$out" && pwd)

PYTHONPATH=$repo "$PY" "$HERE/prepare.py" "$WORK" --size "$SIZE" --vocab "$VOCAB" --max-new "$MAX_NEW" \
  --dtype "$DTYPE"
cat > "$out/job.json" <<EOF
{"peer": "$peer", "size": "$SIZE", "vocab": "$VOCAB", "prompts": $PROMPTS, "n": $N, "max_new": $MAX_NEW,
 "steps": $STEPS, "util": $UTIL, "max_tokens": $MAX_TOKENS, "micro": $MICRO, "ignore_eos": $IGNORE_EOS,
 "dtype": "$DTYPE", "trl_model_dtype": "${TRL_MODEL_DTYPE:-float32}", "verl_attn": "${VERL_ATTN:-sdpa}",
 "verl_recompute": "${VERL_RECOMPUTE:-by card memory}", "date": "$(date -u +%FT%TZ)"}
EOF
mem_pid=
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/gpu_mem.csv" &
  mem_pid=$!
fi
trap '[ -n "$mem_pid" ] && kill "$mem_pid" 2>/dev/null; true' EXIT
start=$(date +%s)
case "$peer" in
  verl_mp|verl_mp_defaults|verl_mp_anchor)
    # verl_mp: the tuned settings of benchmarks/RESULTS.md's fastest GRPO step on one H200
    # (token-budget micro-batches of 18432 tokens, vLLM's weights kept on the GPU between steps);
    # verl_mp_defaults: only the job's settings, the rest left to the defaults and the planner
    # (issue 39). Both take the rollout's log-probs every step (rollout.logprob_gap_freq=1), as
    # the other two systems do.
    tuned=(actor.max_tokens_per_micro_batch="$MAX_TOKENS" ref.max_tokens_per_micro_batch="$MAX_TOKENS"
           rollout.keep_weights_on_gpu=true)
    [ "$peer" = verl_mp_defaults ] && tuned=()
    export VLLM_ENABLE_V1_MULTIPROCESSING=0
    PYTHONPATH=$MEGATRON_SITE:$VLLM_SITE:$repo "$PY" -m verl_mp train --config-name grpo \
      model.path="$WORK/model" model.dtype="$DTYPE" \
      "data.train_files=[$WORK/data/train.parquet]" "data.val_files=[$WORK/data/test.parquet]" \
      data.train_batch_size="$PROMPTS" data.max_prompt_length=64 \
      actor.ppo_mini_batch_size="$PROMPTS" actor.ppo_epochs=1 actor.optim.lr=1e-6 \
      "${tuned[@]}" actor.clip_ratio_low=0.2 actor.clip_ratio_high=0.2 actor.use_kl_loss=true actor.kl_loss_coef=0.001 \
      actor.loss_agg_mode=token-mean \
      rollout.tensor_model_parallel_size=1 rollout.max_model_len=$((MAX_NEW + 128)) \
      rollout.gpu_memory_utilization="$UTIL" \
      rollout.sampling.n="$N" rollout.sampling.max_new_tokens="$MAX_NEW" rollout.sampling.temperature=1.0 \
      rollout.sampling.ignore_eos="$IGNORE_EOS" rollout.val_sampling.max_new_tokens="$MAX_NEW" \
      rollout.logprob_gap_freq=1 \
      trainer.launcher=torchrun trainer.nproc=1 trainer.total_steps="$STEPS" trainer.test_freq=0 \
      trainer.val_before_train=false trainer.save_freq=0 trainer.save_final=false trainer.export_hf_at_end=false \
      trainer.peak_tflops=989 "trainer.logger=[console,jsonl]" trainer.default_local_dir="$out/run" \
      > "$out/$peer.log" 2>&1
    cp "$out/run/metrics.jsonl" "$out/metrics.jsonl"
    cp "$out/run/plan.yaml" "$out/plan.yaml" 2>/dev/null || true ;;
  verl)
    OUT=$out
    # shellcheck source=verl_args.sh
    source "$HERE/verl_args.sh"
    # verl 0.9.1 patches TRL's AutoModelForCausalLMWithValueHead whenever TRL can be imported, and TRL 1.16
    # no longer has that class (ImportError in the FSDP engine's set-up, 2026-12-05). verl does not depend
    # on TRL, so it runs from a view of the peers' site without TRL, as a plain verl install would be.
    view=$WORK/verl-site
    rm -rf "$view" && mkdir -p "$view"
    for entry in "$PEERS_SITE"/*; do
      case $(basename "$entry") in trl|trl-*) ;; *) ln -s "$entry" "$view/" ;; esac
    done
    # verl starts Ray itself; its file logger writes one JSON line per step
    # VERL_ATTN_PATH (verl_args.sh): verl_attn/ for VERL_ATTN=varlen, whose sitecustomize registers peer_varlen
    VERL_FILE_LOGGER_PATH="$out/metrics.jsonl" PYTHONPATH=$VERL_ATTN_PATH$VERL_TF_SITE:$view:$RAY_SITE:$VLLM_SITE:$repo \
      "$PY" -m verl.trainer.main_ppo "${VERL_ARGS[@]}" > "$out/verl.log" 2>&1 ;;
  trl)
    export VLLM_ENABLE_V1_MULTIPROCESSING=0
    cpu=(); [ "${CPU:-0}" = 1 ] && cpu=(--cpu)
    eos=(); [ "$IGNORE_EOS" = true ] && eos=(--ignore-eos)
    PYTHONPATH=$PEERS_SITE:$VLLM_SITE:$repo "$PY" "$HERE/trl_grpo.py" --model "$WORK/model" \
      --data "$WORK/data/train.parquet" --out "$out" --prompts "$PROMPTS" --n "$N" --max-new "$MAX_NEW" \
      --steps "$STEPS" --micro "$MICRO" --util "$UTIL" --model-dtype "${TRL_MODEL_DTYPE:-float32}" \
      "${cpu[@]}" "${eos[@]}" > "$out/trl.log" 2>&1 ;;
  *) echo "run.sh: unknown peer '$peer' (verl_mp, verl_mp_defaults, verl_mp_anchor, verl or trl)" >&2; exit 2 ;;
esac
echo "{\"peer\": \"$peer\", \"wall_s\": $(( $(date +%s) - start ))}" > "$out/wall.json"
echo "run.sh: $peer done in $(( $(date +%s) - start )) s ($out)"
