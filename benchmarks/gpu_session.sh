#!/usr/bin/env bash
# One GPU session on the H200 machine, as back-to-back calls (the machine stays warm ~30 s
# after a call, and files outside the checkout stay while it is up). vLLM 0.26 comes in two
# parts (../shared/tools/gpu-vllm: build.sh .gpu-vllm); megatron-core, omegaconf and antlr
# wheels for Python 3.12 in .whl/.
#   stash        : carry .gpu-vllm/part1; keep it in ~/gvk (outside the checkout).
#                  The checkout (~4 MiB) + the tool's 60 MiB part 1 passed the 64 MiB carry limit on 2026-12-05: move
#                  its last 12 MiB to part 2 (install.sh joins kit.tar.xz.part* in name order):
#                  dd if=part1/kit.tar.xz.part0 of=part2/kit.tar.xz.part0z bs=1M skip=48; truncate -s 48M part1/kit.tar.xz.part0
#   grpo21 UTIL  : carry .gpu-vllm/part2 + .whl; issue 21's configuration: GRPO, random Qwen2-1.5B
#                  body, 64 prompts x 8, <= 1024 new tokens, micro-batch 16, 10 steps, vLLM at
#                  gpu_memory_utilization UTIL; per-step table with memory per phase.
#   bench14      : same carry; rollout speed (standalone vLLM vs the project's rollout, with and
#                  without log-probs, after sleep/wake) and the engine's training MFU.
#   launchers    : carry .gpu-vllm/part2 + .whl + .gpu-ray/ray-kit (issue 22): the same GRPO run under
#                  torchrun and under Ray, side by side, and the Ray GPU test (tests/gpu/test_ray_gpu.py).
#   memory       : carry .whl only: benchmarks/engine_memory.py, the planner vs measured engine peaks.
#   moe          : right after `launchers` (its ~/vllm026), or after `stash` + `stash_moe` carrying
#                  .gpu-vllm/part2 (74 MB with .gpu-moe: over one call's limit), carry .gpu-moe (vLLM's _moe_C library from the
#                  vllm 0.26.0 wheel) + .whl; issue 15: GRPO on a random Qwen3-MoE body (SIZE=moe in gpu_grpo.sh) with
#                  actor.router_replay off and rollout (hooks, and vLLM's own capture: rollout_vllm) (step table: TFLOP/s on active parameters, sync
#                  GB/s, log-prob gap, clip fraction), its generation speed in vLLM alone, and the MoE
#                  local-sync GPU test (EP2 cases need 2 GPUs).
#   dsv3         : after stash + stash_moe, carry .gpu-vllm/part2 + .whl (issue 43): a tiny DeepSeek-V3 (MLA with
#                  DeepSeek's head dims, YaRN) through verify --rollout vllm in bf16, and the sync vs vLLM's loader
#                  (DSV3_VERIFY_TPS= and DSV3_LOADER=0 skip them), GRPO with routing replay (DSV3_GRPO=0 skips it),
#                  and with DSV3_BASELINE=1 the Qwen3-MoE body's GRPO with the same replay on the same card (the bar).
#                  Next: DSV3_VERIFY_TPS= DSV3_LOADER=0 STEPS=3 DSV3_GRPO_S=240 DSV3_BASELINE=1 (~8-9 min).
#   reference    : with ~/vllm026 on the machine, carry .gpu-moe + .whl: benchmarks/logprob_reference.py, vLLM's and the
#                  engine's bf16 log-probs and HF's bf16 against HF fp32 on the same samples (whose rounding is the gap),
#                  for the DeepSeek-V3, Qwen3-MoE and dense 1.5B bodies (REF_VOCAB=full: the 151,936 vocabulary); ~5 min.
#   profile      : after stash + stash_moe, carry .gpu-vllm/part2 + .whl: trainer.profile on a dense and a MoE GRPO step, and the
#                  engine's train step (train_mfu.py --profile): phase times and GPU kernel time by kind.
#   breakdown    : after `stash`, carry .gpu-vllm/part2 + .whl (issue 14 item 4): GRPO on the 1.5B body at 256 x 8 x
#                  1024 new tokens (rollout.sleep_level SLEEP_LEVEL, default 2; KEEP_WEIGHTS=true:
#                  rollout.keep_weights_on_gpu), each phase's time and its parts, then vLLM alone.
#   validate     : after `stash`, carry .gpu-vllm/part2 + .whl: the GPU kernel test (both bf16 paths vs an fp32
#                  engine), the colocated sync tests incl. rollout.sleep_level=2 and keep_weights_on_gpu, and the
#                  1.5B weight sync after each kind of sleep (wake + copy, as the loop's phase) vs awake.
#   syncloop     : after `stash`, carry .gpu-vllm/part2 + .whl: the 1.5B sync in place (one multi-tensor copy) vs
#                  through buckets after each kind of sleep, then `breakdown` with KEEP_WEIGHTS=true, SPEED_S=0.
#   confirm14    : after `stash`, carry .gpu-vllm/part2 + .whl: the sync benchmark (awake, weights kept) and vLLM alone
#                  3 times; then `SYNC_MODES=none KEEP_WEIGHTS=true GAP_FREQ=0 STEPS=4 syncloop` right after.
#   final14      : after `stash`, carry .gpu-vllm/part2 + .whl: what the memory readings cost, then the 256 x 8 x 1024
#                  loop (weights kept, 3 steps) and vLLM alone 3 times on the loop's own first batch of prompts.
#   sync14       : after `stash`, carry .gpu-vllm/part2 + .whl: the memory readings' cost, a short 1.5B loop with the
#                  weights kept (its sync per step), then the sync benchmark (awake, kept) on the same machine.
#   moe_experts  : carry .whl only: benchmarks/moe_experts.py, the routed experts as grouped GEMMs vs SequentialMLP
#                  (one experts module, then the MoE body's engine train step); ~3 min.
#   mfu          : carry .whl only (issue 14 item 2): benchmarks/attention_kernels.py, then train_mfu.py
#                  (VARIANTS, default 4:none,4:none:noent,2:none) profiled, with the allocations live at its peak.
#   main / train : the colocated sync tests and the weight-sync benchmark; the kernel test.
#   transfer     : carry .whl only; 2 GPUs: the weight channel (actor rank 0 -> rollout rank, NCCL),
#                  seconds per GB for 1.5B- and 7B-sized bf16 models, checked bit for bit.
#   demo         : after `stash`, carry .gpu-vllm/part2 + .whl; issue 14 item 5: the GPU demo (preset demo_gpu:
#                  an 8x768 Qwen2 body with the full 151,936-entry vocabulary, warm-started on the GPU, then 30
#                  GRPO steps on the fused log-prob kernel path, val/accuracy every 5 steps); ~5-7 min in all.
#                  Prints the warm start's held-out scores, the step table and the reward/val curve.
#   peers_verl_mp: after `stash`, carry .gpu-vllm/part2 + .whl + .gpu-peers (benchmarks/peers/build_kit.sh): issue 36,
#                  installs vLLM and the peers' kit, runs verl_mp tuned and with its defaults (issue 39) on the peer job
#                  (benchmarks/peers/run.sh; PEER_JOB env passes SIZE/VOCAB/PROMPTS/... on), then the grouped-experts GPU test.
#   peers_trl    : right after peers_verl_mp on the same machine, carry nothing: TRL on the same job.
#   peers_verl   : right after, carry .gpu-ray: verl on the same job, then the three-way table (compare.py).
#                  Each peers_* call tars all results so far to $OUT/peers_results.tgz and prints the table.
#                  PEER_BG=1: verl runs in the background (setsid, PEER_BG_S limit, default 1100 s); the call
#                  waits until the call's 560th s (PEER_WAIT_UNTIL) and, if verl is still running, returns: then `peers_wait` (carry
#                  nothing) waits again, runs the anchor (ANCHOR_STEPS) and prints the table. On 2026-12-06 verl
#                  with SDPA took 92 s a step on an H200, so its 5 steps do not fit one call.
#                  With ANCHOR_STEPS the anchor runs in the same call when verl ends early enough.
#                  VERL_ATTN (benchmarks/peers/verl_args.sh): verl's attention implementation, default sdpa; varlen: torch's
#                  flash varlen kernel (benchmarks/peers/verl_attn/, checked by its check_gpu.py first in the call).
#   logprobs39 W : after `stash`, carry .gpu-vllm/part2 + .whl (issue 39 item 1): rollout log-probs from vLLM's
#                  sampler (patches/vllm_sampled_logprobs.py). W=test: tests/gpu/test_sampled_logprobs_gpu.py with
#                  Model Runner V2 (vLLM 0.26's default for a dense model) and with the V1 runner (~3-4 min);
#                  W=standalone: vLLM alone, 1.5B body, 256 x 8 x <= 1024 new tokens, without log-probs, with
#                  logprobs=0 and with the sampler's, interleaved, plus the two compared token by token (~5 min);
#                  W=project: the project's rollout the same three ways (~5-6 min).
#   offpolicy    : carry .gpu-vllm/part2 + .whl + ray-kit (../shared/tools/gpu-ray); 2 GPUs: GRPO with
#                  the rollout on GPU 1 (off_policy_steps 0 and 1, token TIS) vs colocated on GPU 0.
#   agent        : after `stash`, carry .gpu-vllm/part2 + .whl (issue 37): multi-turn rollouts with tool calls on the
#                  0.5B body: benchmarks/multi_turn_speed.py (one engine: multi-turn at admit_every_steps AGENT_ADMIT
#                  (1,4,16) vs single-turn of as many tokens, at the mean budget and matched per sample), then a
#                  multi-turn GRPO run and a single-turn one whose max_new_tokens is the first's mean model tokens per
#                  sample; generation tokens/s of each (AGENT_STEPS, default 3; AGENT_GRPO=0 skips both, AGENT_SPEED=0 the engine benchmark); ~7-9 min.
#                  First (AGENT_GRAPHS0=0 skips it) the multi-turn case alone with vLLM's own CUDA-graph range (512
#                  tokens) against the planner's (rollout.cudagraph_max_tokens: 768 here); ~2 min more.
#                  AGENT_LOOP_ADMITS="1 16 1 16" (with AGENT_SPEED=0 AGENT_STEPS=2): only the multi-turn GRPO loop, once per
#                  value of rollout.multi_turn.admit_every_steps, in turn on one machine (~100 s a run): the loop's own A/B.
#                  AGENT_LOOP_SINGLE=1 (an s at the end): then the single-turn loop of as many tokens a step (AGENT_SINGLE_ARGS: its extra
#                  overrides, e.g. trainer.profile.steps=[2] trainer.profile.host=true to compare host profiles).
#                  AGENT_SINGLE=stop|both: single-turn GRPO whose responses end at a stop token (a length spread).
#                  AGENT_SPEED_ARGS: more multi_turn_speed.py options (e.g. --multi-only --logprobs-too); AGENT_MT_ARGS:
#                  more overrides for the multi-turn GRPO run (e.g. rollout.multi_turn.admit_every_steps=1; unset, the
#                  planner's 16 on a GPU since 2026-12-06 evening).
#   sglang W     : issue 38 (tests, grpo and vllm ran on an H100, 2026-12-06; REWARD=shaped for both grpo and vllm gives a job
#                  whose weights change every step: benchmarks/gpu_grpo.sh); carry .gpu-sglang + .whl (scripts/gpu-sglang/build.sh .gpu-sglang: one part,
#                  sglang 0.5.17 on the image's torch 2.11). Installs the kit into ~/sglang0517 unless a warm machine
#                  has it. W=tests: tests/gpu/test_rollout_sglang_gpu.py (parity after sync at TP1 at both sleep
#                  levels, sleep/wake memory, SGLangRollout vs a bare sglang.Engine on the same prompts, the 0.5B
#                  body); W=grpo: GRPO on the 0.5B body for 10 steps with rollout.backend=sglang, and the step table;
#                  W=vllm (after `stash`, carry .gpu-vllm/part2 + .whl): the same GRPO with rollout.backend=vllm, and
#                  both tables (W=grpo's metrics stay in /tmp/sgl_results while the machine is up). Triton attention throughout (the kit has no FA3). Call table:
#                  docs/rollout.md ("SGLang on the GPU machine").
# Logs and JSON results go to $OUT; the tables are printed last.
set -uo pipefail
phase=${1:?usage: gpu_session.sh stash|sglang tests|grpo|vllm|peers_verl_mp|peers_trl|peers_verl|peers_wait|logprobs39 W|agent|grpo21 UTIL|bench14|launchers|memory|main|train|transfer|offpolicy|moe|dsv3|reference|profile|demo}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>/dev/null
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)

setup_megatron() {  # megatron-core, omegaconf, antlr from .whl; the checkout on the path (no vLLM)
  if [ -d .whl ]; then  # a later call on the same machine may carry none: /tmp/site stays while it is up
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  elif [ ! -d /tmp/site/megatron ]; then echo "no megatron-core here: carry .whl"; exit 1; fi
  export PYTHONPATH=/tmp/site:$PWD
  [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches  # the editable install maps it; here no install
}

setup_python() {  # setup_megatron plus the vLLM kit (stashed part 1 + carried part 2)
  setup_megatron
  if [ ! -d ~/vllm026/site ]; then
    cp .gpu-vllm/part2/* ~/gvk/ && bash ~/gvk/install.sh ~/gvk ~/vllm026 > "$OUT/vllm_install.log" 2>&1 \
      || { tail -20 "$OUT/vllm_install.log"; exit 1; }
  fi
  export PYTHONPATH=/tmp/site:$HOME/vllm026/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
}

install_moe_lib() {  # vLLM's MoE kernels library, left out of the kit: carried now or stashed (stash_moe)
  cp .gpu-moe/_moe_C_stable_libtorch.abi3.so ~/vllm026/site/vllm/ 2>/dev/null \
    || cp ~/gvk/_moe_C_stable_libtorch.abi3.so ~/vllm026/site/vllm/ 2>/dev/null \
    || [ -e ~/vllm026/site/vllm/_moe_C_stable_libtorch.abi3.so ] || { echo "no vLLM MoE library: carry .gpu-moe"; exit 1; }
}

PEERS_RES=/tmp/peers_results  # issue 36's results: outside the checkout, kept while the machine stays up between calls

run_peers() {  # issue 36: one system on the peer benchmark's job (benchmarks/peers/README.md); results accumulate
  # in $PEERS_RES
  local peer=$1 res=$PEERS_RES
  case "$peer" in
    verl_mp)  # carry .gpu-peers, or nothing right after peers_verl on the same machine (its /tmp/peers, ~/vllm026)
      setup_python
      [ -d /tmp/peers/site ] || bash .gpu-peers/peers-kit/install.sh .gpu-peers/peers-kit /tmp/peers \
        > "$OUT/peers_install.log" 2>&1 || { tail -5 "$OUT/peers_install.log"; exit 1; } ;;
    trl) export PYTHONPATH=/tmp/site:$HOME/vllm026/site:$PWD
      [ -d /tmp/peers/site ] || { echo "no /tmp/peers: run peers_verl_mp first on this machine"; exit 1; } ;;
    verl)  # after peers_trl on the same machine (carry .gpu-ray), or on a fresh one after `stash` and
      # `stash_peers` (carry .gpu-vllm/part2 + .whl: the three kits do not fit one call)
      local kits=.; [ -d .gpu-ray ] || kits=~/peers_stash
      [ -d ~/vllm026/site ] || setup_python
      [ -d /tmp/peers/site ] || bash $kits/.gpu-peers/peers-kit/install.sh $kits/.gpu-peers/peers-kit /tmp/peers \
        > "$OUT/peers_install.log" 2>&1 || { tail -5 "$OUT/peers_install.log"; exit 1; }
      bash $kits/.gpu-ray/ray-kit/install.sh $kits/.gpu-ray/ray-kit /tmp/raysite > "$OUT/ray_install.log" 2>&1 \
        || { tail -5 "$OUT/ray_install.log"; exit 1; }
      case " ${PEER_JOB:-} " in *" VERL_ATTN=varlen "*)  # the kernel against SDPA, and its time on one micro-batch
        CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/peers/verl_attn/check_gpu.py > "$OUT/varlen_check.log" 2>&1
        local crc=$?; tail -1 "$OUT/varlen_check.log" | cut -c1-1200
        [ "$crc" = 0 ] || { echo "varlen check rc=$crc: verl not started"; tail -8 "$OUT/varlen_check.log" | cut -c1-300; exit 1; } ;;
      esac ;;
  esac
  [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches  # the editable install maps it; here no install
  mkdir -p "$res"
  local runs=("$peer"); [ "$peer" = verl_mp ] && runs=(${VERL_MP_RUNS:-verl_mp verl_mp_defaults})  # VERL_MP_RUNS=verl_mp: tuned only
  # on a machine of its own, verl gets a verl_mp run beside it (ANCHOR_STEPS steps): ratios only within one machine
  [ "$peer" = verl ] && [ -n "${ANCHOR_STEPS:-}" ] && runs=(verl verl_mp_anchor)
  for p in "${runs[@]}"; do
    if [ "$p" = verl ] && [ "${PEER_BG:-0}" = 1 ]; then  # verl in the background: its 5 steps may outlast one call
      # from a copy: the next call replaces this checkout while verl still reads its scripts and reward file
      rm -rf /tmp/peers_verl.rc /tmp/peers_bg_repo && mkdir -p /tmp/peers_bg_repo && cp -r benchmarks verl_mp patches /tmp/peers_bg_repo/
      CUDA_VISIBLE_DEVICES=0 setsid nohup bash -c "timeout ${PEER_BG_S:-1100} env ${PEER_JOB:-} bash /tmp/peers_bg_repo/benchmarks/peers/run.sh verl $res/verl; \
        echo \$? > /tmp/peers_verl.rc" > /tmp/peers_verl_bg.log 2>&1 < /dev/null &
      wait_verl_bg; peer_done verl $?; local rc=$?
      [ "$rc" = 255 ] && { finish_peers; echo "verl still running: call \`peers_wait\` next (carry nothing)"; return 0; }
      [ "$rc" = 0 ] || break
      anchor_fits || { finish_peers; return 0; }
    else
      run_peer "$p" "$peer" || break
    fi
  done
  if [ "$peer" = verl_mp ] && [ "${GROUPED_GPU_TEST:-1}" = 1 ]; then  # the grouped experts' padding and custom backward, not yet run on a GPU (2026-12-03)
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_grouped_experts_gpu.py \
      > "$OUT/grouped_experts_gpu.log" 2>&1; echo "grouped experts GPU test rc=$?"; tail -2 "$OUT/grouped_experts_gpu.log"
  fi
  finish_peers
}

run_peer() {  # run_peer P [CALLED_AS]: one system's run.sh in the foreground, then peer_done
  local p=$1 limit=${PEER_S:-$([ "${2:-$1}" = verl_mp ] && echo 250 || echo 520)} job=${PEER_JOB:-}
  [ "$p" = verl_mp_anchor ] && limit=${ANCHOR_S:-150} job="$job STEPS=$ANCHOR_STEPS"
  CUDA_VISIBLE_DEVICES=0 timeout "$limit" env $job bash benchmarks/peers/run.sh "$p" "$PEERS_RES/$p"
  peer_done "$p" $?
}

peer_done() {  # peer_done P RC: its status and errors; returns RC (255: still running), non-zero stops the runs after it
  local p=$1 rc=$2 log=$PEERS_RES/$1/$1.log
  [ "$rc" = 255 ] && return 255
  echo "peer $p rc=$rc"
  grep -E "Error|error:|Traceback" "$log" 2>/dev/null | tail -4 | cut -c1-400
  [ "$p" = verl ] && [ "$rc" != 0 ] && { tail -30 "$log" | cut -c1-300; return "$rc"; }  # no anchor for a failed peer
  return 0
}

finish_peers() {  # every result so far: the raw files and the table
  tar -C "$(dirname "$PEERS_RES")" -czf "$OUT/peers_results.tgz" "$(basename "$PEERS_RES")"
  python3 benchmarks/peers/compare.py "$PEERS_RES" --json "$OUT/peers_summary.json"
}

wait_verl_bg() {  # until the background verl run ends (its exit status) or the call reaches PEER_WAIT_UNTIL s (255)
  local deadline=${PEER_WAIT_UNTIL:-560}  # of this call's 600 s (SECONDS counts from the script's start)
  while [ ! -e /tmp/peers_verl.rc ] && [ $SECONDS -lt $deadline ]; do sleep 5; done
  grep -o "Training Progress:[^|]*|[^|]*| [0-9]*/[0-9]* \[[^]]*\]" "$PEERS_RES/verl/verl.log" 2>/dev/null | tail -1
  [ -e /tmp/peers_verl.rc ] || return 255
  return "$(cat /tmp/peers_verl.rc)"
}

peers_wait() {  # issue 36, the call after `PEER_BG=1 ... peers_verl`: verl's end, then the anchor and the table
  [ -e /tmp/peers_verl_bg.log ] || { echo "no background verl run on this machine"; exit 1; }
  setup_python  # installed by the call before (megatron, vLLM): only the paths and the patches link here
  wait_verl_bg
  peer_done verl $?; local rc=$?
  [ "$rc" = 255 ] && { finish_peers; echo "verl still running: call \`peers_wait\` again"; return 0; }
  [ "$rc" = 0 ] && [ -n "${ANCHOR_STEPS:-}" ] && anchor_fits && run_peer verl_mp_anchor
  finish_peers
}

anchor_fits() {  # verl ended within this call: its anchor (ANCHOR_STEPS) runs here if it fits the call's 600 s
  [ -z "${ANCHOR_STEPS:-}" ] || [ $((SECONDS + ${ANCHOR_S:-150})) -lt 585 ] && return 0
  echo "verl done; its anchor (${ANCHOR_S:-150} s) does not fit this call: \`peers_wait\` next runs it"; return 1
}

bench() {  # bench SIZE NGPU [CUDA_VISIBLE_DEVICES]: both sync modes, one process
  CUDA_VISIBLE_DEVICES=${3:-0,1} timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node "$2" \
    benchmarks/weight_sync.py --size "$1" --modes gather,local --out "$OUT/sync_$1_tp$2.json" \
    > "$OUT/sync_$1_tp$2.log" 2>&1
  echo "sync $1 tp$2 rc=$?"; grep -E '^[{]' "$OUT/sync_$1_tp$2.log" | cut -c1-400
}

run_grpo21() {  # issue 21: the configuration that ran out of memory waking vLLM at step 2
  local util=${1:-0.4}
  setup_python
  SIZE=1.5b MAX_NEW=1024 MICRO=16 UTIL=$util STEPS=${STEPS:-10} GAP_FREQ=${GAP_FREQ:-5} timeout 560 \
    bash benchmarks/gpu_grpo.sh "$OUT/grpo_util$util" > "$OUT/grpo_util$util.log" 2>&1
  echo "grpo util=$util rc=$?"
  grep -E "run failed|Error|error:" "$OUT/grpo_util$util.log" | tail -3 | cut -c1-400
  cp "$OUT/grpo_util$util/metrics.jsonl" "$OUT/grpo_util${util}_metrics.jsonl" 2>/dev/null
  python3 benchmarks/grpo_table.py "$OUT/grpo_util${util}_metrics.jsonl" 2>/dev/null
}

run_bench14() {  # issue 14: rollout speed side by side, and training MFU
  setup_python
  # standalone vLLM without torchrun: under torchrun's environment its own TCP rendezvous hangs
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/rollout_speed.py --mode standalone --model /tmp/rollout_model \
    --out "$OUT/rollout_standalone.json" > "$OUT/rollout_standalone.log" 2>&1
  echo "rollout standalone rc=$?"; grep -E '^[{]' "$OUT/rollout_standalone.log" | tail -1
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/rollout_speed.py --mode project --model /tmp/rollout_model --out "$OUT/rollout_project.json" \
    > "$OUT/rollout_project.log" 2>&1
  echo "rollout project rc=$?"; grep -E '^[{]' "$OUT/rollout_project.log" | tail -1
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/train_mfu.py --out "$OUT/train_mfu.json" > "$OUT/train_mfu.log" 2>&1
  echo "train_mfu rc=$?"; grep -vE "Warning|warn|^\[|^ " "$OUT/train_mfu.log" | tail -9
}

run_launchers() {  # issue 22: Ray mode vs torchrun on the same GRPO configuration
  setup_python
  bash .gpu-ray/ray-kit/install.sh .gpu-ray/ray-kit /tmp/raysite > "$OUT/ray_install.log" 2>&1 || { tail -5 "$OUT/ray_install.log"; exit 1; }
  export PYTHONPATH=/tmp/raysite:$PYTHONPATH
  for launcher in torchrun ray; do
    LAUNCHER=$launcher SIZE=0.5b MICRO=16 STEPS=${STEPS:-5} GAP_FREQ=5 timeout 205 bash benchmarks/gpu_grpo.sh "$OUT/grpo_$launcher" \
      > "$OUT/grpo_$launcher.log" 2>&1
    echo "grpo $launcher rc=$?"; grep -E "run failed|Error|error:" "$OUT/grpo_$launcher.log" | tail -3 | cut -c1-300
    cp "$OUT/grpo_$launcher/metrics.jsonl" "$OUT/launchers_${launcher}_metrics.jsonl" 2>/dev/null
  done
  CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_ray_gpu.py \
    > "$OUT/gpu_ray_test.log" 2>&1; echo "ray gpu test rc=$?"; tail -3 "$OUT/gpu_ray_test.log" | cut -c1-400
  for launcher in torchrun ray; do
    echo "== $launcher"; python3 benchmarks/grpo_table.py "$OUT/launchers_${launcher}_metrics.jsonl" 2>/dev/null
  done
  python3 benchmarks/grpo_compare.py torchrun="$OUT/launchers_torchrun_metrics.jsonl" ray="$OUT/launchers_ray_metrics.jsonl"
}

run_main() {  # 1-GPU colocated sync test and the 1-GPU syncs; the TP=2 test on 2 GPUs
  setup_python
  (CUDA_VISIBLE_DEVICES=0 timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_runtime_cuda.py \
    tests/gpu/test_rollout_gpu.py -k "tp1pp1 or runtime" -s > "$OUT/gpu_tests_tp1.log" 2>&1; echo "tp1 tests rc=$?") &
  bench 1.5b 1 1; bench 7b 1 1
  wait; grep -E "^[{]|passed|failed|Error" "$OUT/gpu_tests_tp1.log" | cut -c1-600 | tail -6
  [ "$ngpu" -ge 2 ] || return 0
  timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_rollout_gpu.py -k tp2pp1 -s \
    > "$OUT/gpu_tests_tp2.log" 2>&1; echo "tp2 test rc=$?"
  grep -E "^[{]|passed|failed|Error" "$OUT/gpu_tests_tp2.log" | cut -c1-600 | tail -6
}

run_train() {  # the fused-kernel engine test, then a short GRPO run of the real trainer
  setup_python
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_engine_kernel_gpu.py \
    -s > "$OUT/gpu_kernel.log" 2>&1; echo "kernel test rc=$?"
  grep -E "^[{]|ms|GiB|passed|failed|Error" "$OUT/gpu_kernel.log" | cut -c1-300 | tail -8
  CUDA_VISIBLE_DEVICES=${GRPO_GPUS:-0} timeout 330 bash benchmarks/gpu_grpo.sh "$OUT/grpo" > "$OUT/grpo.log" 2>&1
  echo "grpo rc=$?"; python3 benchmarks/grpo_table.py "$OUT/grpo/metrics.jsonl" 2>/dev/null
}

run_transfer() {  # issue 16: the weight channel's seconds per GB over NCCL between two GPUs
  setup_megatron
  [ "$ngpu" -ge 2 ] || { echo "transfer needs 2 GPUs"; return 1; }
  for gb in 3 15; do  # ~ Qwen2-1.5B and Qwen2-7B in bf16
    CUDA_VISIBLE_DEVICES=0,1 timeout 250 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      benchmarks/weight_transfer.py --gb $gb --check --iters 3 --out "$OUT/transfer_${gb}gb.json" \
      > "$OUT/transfer_${gb}gb.log" 2>&1
    echo "transfer ${gb}GB rc=$?"; grep -E '^[{]' "$OUT/transfer_${gb}gb.log" | cut -c1-300
  done
}

run_offpolicy() {  # issue 16: rollout on its own GPU, off-policy 0/1, vs colocated (0.5B body, 6 steps)
  setup_python
  [ -d /tmp/raysite ] || bash ray-kit/install.sh ray-kit /tmp/raysite > "$OUT/ray_install.log" 2>&1 || exit 1
  export PYTHONPATH=/tmp/raysite:$PYTHONPATH
  [ "$ngpu" -ge 2 ] || { echo "offpolicy needs 2 GPUs"; return 1; }
  CUDA_VISIBLE_DEVICES=0 STEPS=6 timeout 280 bash benchmarks/gpu_grpo.sh "$OUT/colocated" > "$OUT/colocated.log" 2>&1
  echo "colocated rc=$?"; python3 benchmarks/grpo_table.py "$OUT/colocated/metrics.jsonl" 2>/dev/null
  for k in 0 1; do
    CUDA_VISIBLE_DEVICES=0,1 STEPS=6 LAUNCHER=ray timeout 280 bash benchmarks/gpu_grpo.sh "$OUT/split_k$k" \
      "trainer.placement.pools.gen=[1]" trainer.placement.roles.rollout=gen trainer.off_policy_steps=$k \
      algorithm.rollout_correction.is_level=token > "$OUT/split_k$k.log" 2>&1
    echo "split k=$k rc=$?"; python3 benchmarks/grpo_table.py "$OUT/split_k$k/metrics.jsonl" 2>/dev/null
  done
}

run_moe() {  # issue 15 on one H200 (a second GPU adds the EP2 tests); after `stash` + `stash_moe` carrying
  # .gpu-vllm/part2 + .whl, or on a machine that has ~/vllm026 already, carrying .gpu-moe/ (vLLM 0.26's
  # _moe_C library, which the kit leaves out: 47 MB, too large to travel beside the kit's part 2) + .whl
  setup_python
  install_moe_lib
  # off | rollout (the project's routing hooks) | rollout_vllm (vLLM's own capture, rollout.routing_capture=vllm)
  # one GRPO run fits one call beside the rest; REPLAYS="off rollout" with STEPS=3 GRPO_S=230 TESTS_S=0 for two
  for replay in ${REPLAYS:-rollout_vllm}; do
    local args=(actor.router_replay=${replay%_vllm})
    [ "$replay" = rollout_vllm ] && args+=(rollout.routing_capture=vllm)
    CUDA_VISIBLE_DEVICES=0 WORK=/tmp/moe_work SIZE=moe MAX_NEW=${MAX_NEW:-256} MICRO=16 STEPS=${STEPS:-4} GAP_FREQ=1 timeout ${GRPO_S:-200} \
      bash benchmarks/gpu_grpo.sh "$OUT/moe_grpo_$replay" "${args[@]}" > "$OUT/moe_grpo_$replay.log" 2>&1
    echo "moe grpo router_replay=$replay rc=$?"
    grep -E "run failed|Error|error:" "$OUT/moe_grpo_$replay.log" | tail -3 | cut -c1-400
    cp "$OUT/moe_grpo_$replay/metrics.jsonl" "$OUT/moe_${replay}_metrics.jsonl" 2>/dev/null
    python3 benchmarks/grpo_table.py "$OUT/moe_${replay}_metrics.jsonl" 2>/dev/null
  done
  local model=/tmp/moe_work/model  # the MoE body gpu_grpo.sh wrote
  CUDA_VISIBLE_DEVICES=0 timeout ${SPEED_S:-100} python3 benchmarks/rollout_speed.py --mode standalone --model "$model" \
    --out "$OUT/moe_rollout_standalone.json" > "$OUT/moe_rollout_standalone.log" 2>&1
  echo "moe rollout standalone rc=$?"; grep -E '^[{]' "$OUT/moe_rollout_standalone.log" | tail -1 | cut -c1-600
  [ "${TESTS_S:-80}" -gt 0 ] && CUDA_VISIBLE_DEVICES=${GPUS:-0,1} timeout ${TESTS_S:-80} python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/gpu/test_rollout_gpu.py -k moe -s > "$OUT/moe_tests.log" 2>&1
  echo "moe gpu tests rc=$?"; grep -E "^[{]|passed|failed|skipped|Error" "$OUT/moe_tests.log" | cut -c1-500 | tail -6
}

run_dsv3() {  # issue 43: after `stash` (+ `stash_moe`, or carry .gpu-moe on a machine that has ~/vllm026), carrying
  # .gpu-vllm/part2 + .whl on a fresh machine. A tiny DeepSeek-V3 (MLA latent 576, YaRN, 4 experts) through
  # `verify --rollout vllm` in bf16 (engine vs HF, one optimizer step, the gather sync, vLLM vs the engine), then the
  # sync vs vLLM's own loader on the HF export. On CUDA, vLLM 0.26's MLA runs bf16/fp16 only (every decode backend
  # refuses fp32) and its prefill backends take only the released head shapes (qk_nope 128, qk_rope 64, v 128 for
  # DeepSeek; first run 2026-12-05 refused the CPU tests' 16/16/24), so the GPU model has DeepSeek-V3's head dims.
  # The kit drops vLLM's _flashmla_C: MLA_BACKEND (default TRITON_MLA) picks a backend that needs no FlashMLA.
  setup_python
  install_moe_lib
  local model=/tmp/dsv3_model
  python3 -c "from verl_mp.demo.tiny_models import ROLLOUT_OVERRIDES as R, build_tiny_checkpoint as b; b('deepseek_v3', '$model', rope_scaling=dict(type='yarn', factor=40.0, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0, original_max_position_embeddings=64), max_position_embeddings=2560, **{**R['deepseek_v3'], 'qk_nope_head_dim': 128, 'v_head_dim': 128})" > "$OUT/dsv3_build.log" 2>&1 || { tail -5 "$OUT/dsv3_build.log"; return 1; }
  for tp in ${DSV3_VERIFY_TPS-1}; do  # DSV3_VERIFY_TPS= skips it (passed on an H100, 2026-12-05)
    CUDA_VISIBLE_DEVICES=0 VLLM_ATTENTION_BACKEND=${MLA_BACKEND:-TRITON_MLA} timeout ${VERIFY_S:-240} \
      python3 -m verl_mp verify --model "$model" --rollout vllm --rollout-tp $tp --dtype bf16 > "$OUT/dsv3_verify_bf16.log" 2>&1
    echo "dsv3 verify bf16 rc=$?"; grep -E '^[{]|Error' "$OUT/dsv3_verify_bf16.log" | tail -2 | cut -c1-900
  done
  if [ "${DSV3_LOADER:-1}" = 1 ]; then  # DSV3_LOADER=0 skips it (63 of 63 equal on an H100, 2026-12-06)
    CUDA_VISIBLE_DEVICES=0 VLLM_ATTENTION_BACKEND=${MLA_BACKEND:-TRITON_MLA} timeout ${VERIFY_S:-240} python3 -m torch.distributed.run \
      --standalone --nproc-per-node 1 -m verl_mp.cli.rank_verify_rollout --model "$model" --dtype bf16 \
      --loader-check /tmp/dsv3_export --out "$OUT/dsv3_loader.json" > "$OUT/dsv3_loader.log" 2>&1
    echo "dsv3 loader check rc=$?"; grep -E 'Error' "$OUT/dsv3_loader.log" | grep -v ChildFailed | tail -2 | cut -c1-600
    cut -c1-1200 "$OUT/dsv3_loader.json" 2>/dev/null
  fi
  # GRPO on the DeepSeek-V3 body (gpu_grpo.sh SIZE=dsv3) with routing replay from the rollout's own routing,
  # as the Qwen3-MoE run of `moe` (its gap is the bar), then the table
  [ "${DSV3_GRPO:-1}" = 1 ] || return 0
  CUDA_VISIBLE_DEVICES=0 VLLM_ATTENTION_BACKEND=${MLA_BACKEND:-TRITON_MLA} WORK=/tmp/dsv3_work SIZE=dsv3 MICRO=16 \
    STEPS=${STEPS:-5} GAP_FREQ=1 timeout ${DSV3_GRPO_S:-300} bash benchmarks/gpu_grpo.sh "$OUT/dsv3_grpo" \
    actor.router_replay=rollout > "$OUT/dsv3_grpo.log" 2>&1
  echo "dsv3 grpo rc=$?"; grep -E "run failed|Error|error:" "$OUT/dsv3_grpo.log" | tail -3 | cut -c1-400
  cp "$OUT/dsv3_grpo/metrics.jsonl" "$OUT/dsv3_grpo_metrics.jsonl" 2>/dev/null
  python3 benchmarks/grpo_table.py "$OUT/dsv3_grpo_metrics.jsonl" 2>/dev/null
  # DSV3_BASELINE=1: the bar on the same card, in the same call: the Qwen3-MoE body of `moe` with the same replay
  # (the project's hooks), the same steps (its 2026-12-02 gap was measured on an H200)
  [ "${DSV3_BASELINE:-0}" = 1 ] || return 0
  CUDA_VISIBLE_DEVICES=0 WORK=/tmp/moe_work SIZE=moe MICRO=16 STEPS=${STEPS:-5} GAP_FREQ=1 timeout ${MOE_GRPO_S:-240} \
    bash benchmarks/gpu_grpo.sh "$OUT/moe_grpo" actor.router_replay=rollout > "$OUT/moe_grpo.log" 2>&1
  echo "qwen3-moe grpo rc=$?"; grep -E "run failed|Error|error:" "$OUT/moe_grpo.log" | tail -3 | cut -c1-400
  cp "$OUT/moe_grpo/metrics.jsonl" "$OUT/moe_grpo_metrics.jsonl" 2>/dev/null
  python3 benchmarks/grpo_table.py "$OUT/moe_grpo_metrics.jsonl" 2>/dev/null
}

run_reference() {  # issues 43 and 36: whose rounding the rollout-vs-trainer gap is (benchmarks/logprob_reference.py):
  # vLLM's sampled log-probs, the engine's and HF transformers' in bf16 against HF in fp32, on the same samples, for
  # the DeepSeek-V3 and Qwen3-MoE bodies of the `dsv3` call's GRPO runs (/tmp/dsv3_work, /tmp/moe_work: built here by
  # gpu_grpo.sh BUILD_ONLY=1 unless a `dsv3` call left them) and the dense 1.5B body of the peers' job (the tiny
  # tokenizer; REF_VOCAB=full: 151,936 entries). On a machine with ~/vllm026 (after any vLLM call) carry .gpu-moe + .whl;
  # on a fresh one `stash` + `stash_moe` first, then carry .gpu-vllm/part2 + .whl. ~1-2 min a body.
  setup_python
  ( install_moe_lib ) || echo "no vLLM MoE library here: the MoE bodies will fail"
  local dense=/tmp/ref_dense_${REF_VOCAB:-tiny}/model
  for model in ${REF_MODELS:-/tmp/dsv3_work/model /tmp/moe_work/model $dense}; do
    local size=${model#/tmp/}; size=${size%_work/model}
    if { [ "$size" = dsv3 ] || [ "$size" = moe ]; } && [ ! -e "$model/config.json" ]; then  # the GRPO runs' bodies
      WORK=/tmp/${size}_work SIZE=$size BUILD_ONLY=1 bash benchmarks/gpu_grpo.sh /tmp/${size}_unused \
        > "$OUT/ref_build_$size.log" 2>&1 || tail -3 "$OUT/ref_build_$size.log"
    fi
    if [ "$model" = $dense ]; then  # the peers' job's body (benchmarks/peers/prepare.py; up to date: kept)
      python3 benchmarks/peers/prepare.py "$(dirname $dense)" --size 1.5b --vocab "${REF_VOCAB:-tiny}" \
        > "$OUT/ref_build.log" 2>&1 || { tail -5 "$OUT/ref_build.log"; continue; }
    fi
    [ -e "$model/config.json" ] || { echo "$model: not on this machine, skipped"; continue; }
    local name; name=$(basename "$(dirname "$model")")_$(basename "$model")
    local mla=(CUDA_VISIBLE_DEVICES=0) eager=()  # the kit has no FlashMLA (as in run_dsv3)
    grep -q kv_lora_rank "$model/config.json" && mla+=(VLLM_ATTENTION_BACKEND="${MLA_BACKEND:-TRITON_MLA}")
    # a mixture of experts: vLLM eager, as the GRPO runs ran it (routing replay's hooks capture)
    grep -qE '"(num_experts|n_routed_experts)"' "$model/config.json" && eager=(--eager)
    # the dense body also without the engine's fused Triton kernels (log-prob, RMSNorm, SwiGLU: the GPU-only path;
    # issue 36: on the CPU the engine and HF bf16 agree to 2e-4)
    local kernels=(auto); [ "$model" = $dense ] && [ "${REF_TORCH_KERNELS:-1}" = 1 ] && kernels+=(torch)
    for k in "${kernels[@]}"; do
      local tag=$name; [ "$k" = torch ] && tag=${name}_torch_kernels
      env "${mla[@]}" VERL_MP_KERNELS=$k timeout ${REF_S:-150} python3 -m torch.distributed.run --standalone \
        --nproc-per-node 1 benchmarks/logprob_reference.py --model "$model" --prompts ${REF_PROMPTS:-32} \
        --samples ${REF_SAMPLES:-4} --max-new ${REF_MAX_NEW:-128} "${eager[@]}" --out "$OUT/reference_$tag.json" \
        > "$OUT/reference_$tag.log" 2>&1
      echo "== $tag rc=$?"; grep -A6 '^pair' "$OUT/reference_$tag.log"
      grep -E 'Error' "$OUT/reference_$tag.log" | grep -v ChildFailed | tail -2 | cut -c1-400
    done
  done
  # at most 8 files come back: the logs in one archive, the JSON results beside it
  (cd "$OUT" && tar -czf reference_logs.tgz ./*.log && rm -f ./*.log)
}

run_profile() {  # where GPU steps go (issues 14, 15): trainer.profile on step 2 of a dense and a MoE GRPO
  # run, and the engine's train step at micro-batch 4 (the MoE library carried in .gpu-moe or stashed)
  setup_python
  install_moe_lib
  CUDA_VISIBLE_DEVICES=0 SIZE=0.5b MICRO=16 STEPS=2 GAP_FREQ=5 timeout 150 bash benchmarks/gpu_grpo.sh "$OUT/prof_dense" \
    "trainer.profile.steps=[2]" > "$OUT/prof_dense.log" 2>&1; echo "dense rc=$?"
  CUDA_VISIBLE_DEVICES=0 WORK=/tmp/moe_work SIZE=moe MICRO=16 STEPS=2 GAP_FREQ=5 timeout 220 bash benchmarks/gpu_grpo.sh \
    "$OUT/prof_moe" "trainer.profile.steps=[2]" > "$OUT/prof_moe.log" 2>&1; echo "moe rc=$?"
  CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/train_mfu.py \
    --variants 4:none --repeats 2 --profile "$OUT/prof_train" --out "$OUT/prof_train_mfu.json" > "$OUT/prof_train.log" 2>&1
  echo "train_mfu rc=$?"
  for run in prof_dense prof_moe; do
    cp "$OUT/$run/profile/step_2/actor_rollout_ref_rank0_phases.json" "$OUT/${run}_phases.json" 2>/dev/null
    cp "$OUT/$run/profile/step_2/actor_rollout_ref_rank0.txt" "$OUT/${run}_top.txt" 2>/dev/null
    echo "== $run"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: round(v['cpu_ms']) for k, v in d['phases'].items()}); print({k: round(v) for k, v in d['device_ms_by_kind'].items()})" "$OUT/${run}_phases.json"
  done
  grep -E '^[{]"profile' "$OUT/prof_train.log" | cut -c1-700
  cp "$OUT"/prof_train/*.txt "$OUT/prof_train_top.txt" 2>/dev/null
  head -45 "$OUT/prof_train_top.txt" 2>/dev/null | cut -c1-160  # the train step's kernels by device time
}

run_mfu() {  # issue 14 item 2, carry .whl only: attention kernels, the engine's train step profiled, memory at its peak
  setup_megatron
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_kernels_layers.py \
    tests/unit/test_kernels_logprob.py > "$OUT/kernel_tests.log" 2>&1; echo "kernel tests rc=$?"; tail -2 "$OUT/kernel_tests.log"
  [ -n "${ATTENTION:-}" ] && CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/attention_kernels.py --out "$OUT/attention.json" 2>&1 | tail -5
  CUDA_VISIBLE_DEVICES=0 timeout ${MFU_S:-300} python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/train_mfu.py --variants "${VARIANTS:-4:none,4:none:noent,2:none}" --repeats 2 ${MFU_ARGS:---profile $OUT/prof_train --memory} \
    --out "$OUT/train_mfu.json" > "$OUT/train_mfu.log" 2>&1
  echo "train_mfu rc=$?"
  grep -E '^[{]"memory' "$OUT/train_mfu.log" | cut -c1-1500
  grep -E '^[{]"profile' "$OUT/train_mfu.log" | cut -c1-900
  for f in "$OUT"/prof_train/*.txt; do [ -e "$f" ] && { echo "== $f"; head -32 "$f" | cut -c1-150; }; done
  grep -vE "Warning|warn|^\[|^ " "$OUT/train_mfu.log" | tail -6
}

run_breakdown() {  # issue 14 item 4, after `stash`, carry .gpu-vllm/part2 + .whl: a GRPO step of the 1.5B body
  # (tiny vocabulary) at 256 prompts x 8 samples x 1024 new tokens, phase by phase (step 1 also checks the
  # rollout-vs-trainer log-prob gap), then vLLM alone generating the same batch size
  setup_python
  # MAX_TOKENS (default 18432 = 16 x 1152): token-budget micro-batches; "" for 16 rows each (2.8x padding here)
  CUDA_VISIBLE_DEVICES=0 WORK=/tmp/bd_work SIZE=1.5b PROMPTS=256 N=8 MAX_NEW=1024 MICRO=16 STEPS=${STEPS:-2} GAP_FREQ=${GAP_FREQ:-5} \
    MAX_TOKENS=${MAX_TOKENS-18432} \
    timeout ${GRPO_S:-330} bash benchmarks/gpu_grpo.sh "$OUT/breakdown" rollout.sleep_level=${SLEEP_LEVEL:-2} \
    rollout.keep_weights_on_gpu=${KEEP_WEIGHTS:-false} > "$OUT/breakdown.log" 2>&1
  echo "breakdown rc=$?"; grep -E "run failed|Error|error:" "$OUT/breakdown.log" | tail -3 | cut -c1-400
  cp "$OUT/breakdown/metrics.jsonl" "$OUT/breakdown_metrics.jsonl" 2>/dev/null
  python3 benchmarks/grpo_table.py "$OUT/breakdown_metrics.jsonl" 2>/dev/null
  # vLLM alone on the loop's own first batch of prompts (SPEED_REPEATS times), or random ones (SAME_PROMPTS=0)
  local same=(--data /tmp/bd_work/data/train.parquet); [ "${SAME_PROMPTS:-1}" = 0 ] && same=()
  [ "${SPEED_S:-170}" = 0 ] || CUDA_VISIBLE_DEVICES=0 timeout ${SPEED_S:-170} python3 benchmarks/rollout_speed.py --mode standalone --model /tmp/bd_work/model \
    --prompts 256 --n 8 --max-new-tokens 1024 --repeats ${SPEED_REPEATS:-1} --cases no_logprobs --warmup-prompts 32 "${same[@]}" \
    --out "$OUT/breakdown_standalone.json" > "$OUT/breakdown_standalone.log" 2>&1
  echo "standalone vLLM rc=$?"; grep -E '^[{]' "$OUT/breakdown_standalone.log" | tail -1
  python3 - "$OUT/breakdown_metrics.jsonl" <<'PY'
import json, sys
for row in (json.loads(line) for line in open(sys.argv[1]) if line.strip()):
    print({k: round(v, 4) for k, v in row.items() if isinstance(v, (int, float)) and k.split("/")[0] in
           ("timing", "perf", "rollout") and ("sync" in k or k.startswith(("timing", "perf")))})
PY
}

run_validate() {  # after `stash`, carry .gpu-vllm/part2 + .whl: the GPU checks written without a GPU
  # (2026-12-02): both bf16 kernel paths against an fp32 engine, the layer kernels, and the colocated
  # sync after rollout.sleep_level=2 (vLLM drops its weights; the sync must rewrite every one)
  setup_python
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/gpu/test_engine_kernel_gpu.py \
    > "$OUT/validate_kernel.log" 2>&1; echo "kernel GPU test rc=$?"
  grep -E "vs fp32|triton vs|passed|failed|Error" "$OUT/validate_kernel.log" | cut -c1-500 | tail -6
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/gpu/test_rollout_gpu.py \
    -k "sleep_level_2 or keeping_the_weights or tp1pp1" > "$OUT/validate_rollout.log" 2>&1; echo "rollout GPU tests rc=$?"
  grep -E "^[{]|passed|failed|Error" "$OUT/validate_rollout.log" | cut -c1-500 | tail -6
  sync_after_sleep local awake,level1,level2,keep
}

run_logprobs39() {  # issue 39 item 1: test | standalone | project (see the header)
  setup_python
  local model=/tmp/bd_work/model
  [ -e $model/config.json ] || python3 -c "import torch; from verl_mp.demo.tiny_models import save_tiny_qwen2; \
save_tiny_qwen2('$model', num_kv_heads=2, max_position_embeddings=1152, dtype=torch.bfloat16, hidden_size=1536, \
num_layers=28, num_heads=12, intermediate_size=8960)"
  case "$1" in
    test)
      for runner in ${RUNNERS:-v2 v1}; do  # v2: vLLM's default for this dense model; v1: VLLM_USE_V2_MODEL_RUNNER=0
        local pick=(); [ $runner = v1 ] && pick=(VLLM_USE_V2_MODEL_RUNNER=0)
        CUDA_VISIBLE_DEVICES=0 env "${pick[@]}" timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/gpu/test_sampled_logprobs_gpu.py -k tp1 \
          > "$OUT/lp39_test_$runner.log" 2>&1
        echo "sampled log-probs GPU test ($runner runner) rc=$?"
        grep -E '^\[\{|passed|failed|Error' "$OUT/lp39_test_$runner.log" | cut -c1-700 | tail -4
      done ;;
    standalone)  # without torchrun (under its environment vLLM's own TCP rendezvous hangs)
      CUDA_VISIBLE_DEVICES=0 timeout 560 python3 benchmarks/rollout_speed.py --mode standalone --model $model \
        --prompts 256 --n 8 --max-new-tokens 1024 --repeats ${REPEATS:-1} --warmup-prompts 32 \
        --cases no_logprobs,logprobs,sampler_logprobs --out "$OUT/lp39_standalone.json" > "$OUT/lp39_standalone.log" 2>&1
      echo "standalone rc=$?"; grep -E '^[{]' "$OUT/lp39_standalone.log" | tail -1 ;;
    project)
      CUDA_VISIBLE_DEVICES=0 timeout 560 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
        benchmarks/rollout_speed.py --mode project --model $model --prompts 256 --n 8 --max-new-tokens 1024 \
        --repeats ${REPEATS:-1} --out "$OUT/lp39_project.json" > "$OUT/lp39_project.log" 2>&1
      echo "project rc=$?"; grep -E '^[{]' "$OUT/lp39_project.log" | tail -1 ;;
    *) echo "usage: gpu_session.sh logprobs39 test|standalone|project"; exit 2 ;;
  esac
}

standalone_repeats() {  # REPEATS TIMEOUT_S: vLLM alone on breakdown's model (the 1.5B body, tiny vocabulary) and batch
  # (256 prompts x 8 x <= 1024 new tokens), REPEATS times in one process, each repeat kept
  python3 -c "import torch; from verl_mp.demo.tiny_models import save_tiny_qwen2; save_tiny_qwen2('/tmp/bd_work/model', \
num_kv_heads=2, max_position_embeddings=1152, dtype=torch.bfloat16, hidden_size=1536, num_layers=28, num_heads=12, \
intermediate_size=8960)"
  CUDA_VISIBLE_DEVICES=0 timeout "$2" python3 benchmarks/rollout_speed.py --mode standalone --model /tmp/bd_work/model \
    --prompts 256 --n 8 --max-new-tokens 1024 --repeats "$1" --cases no_logprobs --warmup-prompts 32 \
    --out "$OUT/standalone_repeats.json" > "$OUT/standalone_repeats.log" 2>&1
  echo "standalone vLLM rc=$?"; grep -E '^[{]' "$OUT/standalone_repeats.log" | tail -1
}

memory_call_costs() {  # microseconds per call of the readings verl_mp.utils.memory takes, with 60 GiB allocated
  CUDA_VISIBLE_DEVICES=0 timeout 60 python3 - <<'PY' 2>&1 | tail -3
import time, torch
held = torch.empty(60 * 2**30, dtype=torch.uint8, device="cuda")
from verl_mp.utils.memory import _allocator_bytes
calls = {"mem_get_info": torch.cuda.mem_get_info, "memory_allocated": torch.cuda.memory_allocated,
         "memory_stats_as_nested_dict": torch.cuda.memory_stats_as_nested_dict, "verl_mp_allocator_bytes": _allocator_bytes,
         "memory_reserved": torch.cuda.memory_reserved, "reset_peak_memory_stats": torch.cuda.reset_peak_memory_stats,
         "max_memory_allocated": torch.cuda.max_memory_allocated, "synchronize": torch.cuda.synchronize}
cost = {}
for name, fn in calls.items():
    fn()
    start = time.perf_counter()
    for _ in range(200):
        fn()
    cost[name] = round((time.perf_counter() - start) / 200 * 1e6, 1)
print({"memory_call_us": cost})
PY
}

sync_after_sleep() {  # MODES SLEEPS: the loop's weight-sync phase without the loop (1.5B shape, bucket 256 MB as the
  # loop's default): vLLM put to sleep (level 1, level 2, weights kept), then wake + copy, against never sleeping
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/weight_sync.py --size 1.5b --modes "$1" --sleep "$2" --iters 7 --bucket-mb 256 \
    --out "$OUT/sync_sleep_1.5b.json" > "$OUT/sync_sleep_1.5b.log" 2>&1; echo "sync after sleep rc=$?"
  python3 - "$OUT/sync_sleep_1.5b.json" <<'PY'
import json, sys
print("mode | sleep | s (wake weights + copy) | s/GB | x awake | wake weights s | sleep s | wake KV s | loader diff | all s")
rows = json.load(open(sys.argv[1]))
for r in rows:
    awake = next(x["seconds_median"] for x in rows if x["sleep"] == "awake" and x["mode"] == r["mode"])
    print(r["mode"], r["sleep"], f"{r['seconds_median']:.4f}", f"{r['seconds_per_model_gb']:.4f}",
          f"{r['seconds_median'] / awake:.2f}", *(f"{r.get(k, 0):.4f}" for k in ("wake_weights_s", "sleep_s", "wake_kv_cache_s")),
          r.get("local_vs_loader_max_abs_diff"), [round(t, 4) for t in r["seconds_all"]], sep=" | ")
PY
}

run_demo() {  # issue 14 item 5: GRPO that learns with the full vocabulary (demo_gpu) on one H200
  setup_python
  local run=/tmp/demo_run  # the run directory stays here; only the small files are copied to $OUT
  # DEMO_S: the warm start (~1 min) + start-up (~1 min) + 30 steps + 7 validations, inside one call
  CUDA_VISIBLE_DEVICES=0 VERL_MP_CACHE=/tmp/demo_cache timeout ${DEMO_S:-420} python3 -m verl_mp train \
    --config-name demo_gpu trainer.default_local_dir=$run trainer.save_final=false "$@" > "$OUT/demo.log" 2>&1
  echo "demo rc=$?"
  grep -E "run failed|Error|error:" "$OUT/demo.log" | tail -3 | cut -c1-400
  cp /tmp/demo_cache/demo-*/sft_model/warm_start.json "$OUT/demo_warm_start.json" 2>/dev/null
  cp "$run/metrics.jsonl" "$OUT/demo_metrics.jsonl" 2>/dev/null
  cp "$run/summary.md" "$run/curves.png" "$OUT/" 2>/dev/null
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('warm start', r['seconds'], 's, held-out', r['held_out'])" \
    "$OUT/demo_warm_start.json"
  python3 benchmarks/grpo_table.py "$OUT/demo_metrics.jsonl" 2>/dev/null
  python3 - "$OUT/demo_metrics.jsonl" <<'PY'
import json, sys
print("step | reward/score/mean | val/accuracy")
for row in (json.loads(line) for line in open(sys.argv[1]) if line.strip()):
    cells = [row.get(k) for k in ("reward/score/mean", "val/accuracy")]
    if any(c is not None for c in cells):
        print(row["step"], *("-" if c is None else f"{c:.3f}" for c in cells), sep=" | ")
PY
}

agent_speed() {  # NAME ARGS...: benchmarks/multi_turn_speed.py on the 0.5B body into $OUT/NAME.{json,log}
  local name=$1; shift
  CUDA_VISIBLE_DEVICES=0 timeout ${AGENT_SPEED_S:-240} python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/multi_turn_speed.py --model /tmp/agent_model --size 0.5b --repeats ${AGENT_REPEATS:-3} "$@" \
    --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"; grep -E '^[{]' "$OUT/$name.log" | tail -1 | cut -c1-2400
}

agent_tokens_per_sample() {  # a multi-turn loop run's model tokens a step (its steps >= 2) per sample; nothing
  # (and status 1) when it logged no step
  python3 - "$1" $(( ${PROMPTS:-64} * ${N:-8} )) <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()] if os.path.exists(sys.argv[1]) else []
rows = [r for r in rows if "rollout/multi_turn/model_tokens" in r and r["step"] >= 2] or \
    [r for r in rows if "rollout/multi_turn/model_tokens" in r]
if not rows:
    sys.exit(1)
print(round(sum(r["rollout/multi_turn/model_tokens"] for r in rows) / len(rows) / int(sys.argv[2])))
PY
}

wait_gpu_free() {  # until no process holds the GPU (a run stopped by `timeout` may still be ending), at most $1 s
  local until=$((SECONDS + ${1:-60}))
  while [ -n "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && [ $SECONDS -lt $until ]; do
    sleep 2
  done
}

run_agent() {  # issue 37: multi-turn generation speed (model tokens/s) vs single-turn of as many tokens, one GPU
  # AGENT_SPEED=0 skips the engine benchmark (agent_speed): AGENT_REPEATS (3) repeats per case, AGENT_ADMIT (1,4,16)
  # its admit_every_steps values; AGENT_GRAPHS0=0 skips its first case: the multi-turn rollout with vLLM's own
  # CUDA-graph range (512 tokens; a step of 512 decodes plus the next turns' prefill runs without a graph), before
  # the planner's (rollout.cudagraph_max_tokens). AGENT_GRPO=0 skips the GRPO runs, AGENT_SINGLE (below) picks
  # the single-turn ones.
  setup_python
  if [ "${AGENT_SPEED:-1}" = 1 ]; then
    [ "${AGENT_GRAPHS0:-1}" = 1 ] && agent_speed multi_turn_speed_vllm_graphs --admit-every 1 --cudagraph-max-tokens 0 --multi-only
    agent_speed multi_turn_speed --admit-every ${AGENT_ADMIT:-1,4,16} ${AGENT_SPEED_ARGS:-}
  python3 - "$OUT/multi_turn_speed_vllm_graphs.json" "$OUT/multi_turn_speed.json" <<'PY'
import json, os, sys
print("case | graphs to | start s | admit | multi-turn tok/s | engine steps | prefix cached | single (mean budget) | single matched | ratio matched")
for path in [p for p in sys.argv[1:] if os.path.exists(p)]:
    r = json.load(open(path))
    e = r["engine"]
    for k, m in r["multi_turn_by_admit_every"].items():
        print(os.path.basename(path), e["vllm_max_cudagraph_capture_size"], e["start_s"], k, f"{m['tokens_per_s']:.0f}",
              m["engine_steps"], f"{r['multi_turn'].get('prefix_cached_frac', float('nan')):.2f}",
              f"{r['single_turn']['tokens_per_s']:.0f}" if "single_turn" in r else "-",
              f"{r['single_turn_matched']['tokens_per_s']:.0f}" if "single_turn_matched" in r else "-",
              f"{m['tokens_per_s'] / r['single_turn_matched']['tokens_per_s']:.3f}" if "single_turn_matched" in r else "-",
              sep=" | ")
    for k, prof in r.get("profile", {}).items():  # --profile: the GPU's busy time against the case's own seconds
        plain = r["multi_turn_by_admit_every"][k]["seconds"]
        print(f"profile admit {k}: GPU busy {prof['device_busy_ms'] / 1e3:.2f} s of {prof['wall_s']:.2f} s profiled "
              f"({sorted(plain)[len(plain) // 2]:.2f} s unprofiled), {prof['engine_steps']:.0f} steps; by kind:",
              {kind: round(ms) for kind, ms in list(prof["device_ms_by_kind"].items())[:6]})
PY
  fi
  [ "${AGENT_GRPO:-1}" = 1 ] || return 0  # AGENT_GRPO=0: the engine benchmark only
  # the GRPO loop: 4 turns of <= 256 tokens (every turn that stops calls the calculator; stop tokens 5,6,7 end a turn
  # of the random model), then single-turn with max_new_tokens = the multi-turn run's mean model tokens per sample
  # rollout log-probs every step (the default; the sampler's, also in multi-turn since 2026-12-06)
  local common=(SIZE=0.5b STEPS=${AGENT_STEPS:-3} GAP_FREQ=${AGENT_GAP_FREQ:-1} MAX_NEW=1024 MICRO=16)
  local multi=(rollout.sampling.max_new_tokens=256 rollout.multi_turn.enable=true rollout.multi_turn.max_turns=4
    rollout.multi_turn.max_total_tokens=1152 "rollout.multi_turn.tools=[calculator]"
    rollout.multi_turn.tool_parser=benchmarks.multi_turn_speed:always_calls "rollout.sampling.stop_token_ids=[5,6,7]")
  if [ -n "${AGENT_LOOP_ADMITS:-}" ]; then  # e.g. "1 16 1 16": the multi-turn loop at each admit_every_steps, in turn
    # on this machine (the loop's own A/B: each step's generate rate; step 1 warms up), then nothing else
    # a trailing c (e.g. "16 16c"): that run with rollout.multi_turn.carry_over (partial rollouts across steps)
    # an s (e.g. "16 s 16 s": pairs, alternating on one machine): the single-turn run of as many tokens a step as the
    # loop run before it (its steps >= 2), every response of that length (ignore EOS), AGENT_SINGLE_ARGS passed
    # AGENT_LOOP_SINGLE=1: an s after the last run
    local a i=0 carry per admits="$AGENT_LOOP_ADMITS"
    [ "${AGENT_LOOP_SINGLE:-0}" = 1 ] && admits="$admits s"
    for a in $admits; do
      i=$((i + 1))
      wait_gpu_free 60  # the run before may have been stopped by its time limit and still be ending
      if [ "$a" = s ]; then
        # 2026-12-07: a run stopped by its limit had not yet written its one step when the next read it
        per=$(agent_tokens_per_sample "$OUT/loop_$((i - 1))/metrics.jsonl") || {
          echo "single-turn loop $i skipped: loop $((i - 1)) logged no step"; continue; }
        env "${common[@]}" timeout ${AGENT_SINGLE_S:-200} bash benchmarks/gpu_grpo.sh "$OUT/loop_$i" \
          rollout.sampling.max_new_tokens="$per" rollout.sampling.ignore_eos=true ${AGENT_SINGLE_ARGS:-} > "$OUT/loop_$i.log" 2>&1
        echo "single-turn loop $i ($per tokens each, as loop $((i - 1))) rc=$?"
        cp "$OUT/loop_$i/metrics.jsonl" "$OUT/loop_${i}_single_metrics.jsonl" 2>/dev/null
        continue
      fi
      carry=()
      case "$a" in *c) a=${a%c}; carry=(rollout.multi_turn.carry_over=true algorithm.rollout_correction.is_level=token) ;; esac
      env "${common[@]}" timeout ${AGENT_LOOP_S:-200} bash benchmarks/gpu_grpo.sh "$OUT/loop_$i" "${multi[@]}" \
        rollout.multi_turn.admit_every_steps="$a" "${carry[@]}" ${AGENT_MT_ARGS:-} > "$OUT/loop_$i.log" 2>&1
      echo "multi-turn loop $i (admit every $a${carry:+, carry-over}) rc=$?"
      cp "$OUT/loop_$i/metrics.jsonl" "$OUT/loop_${i}_admit${a}${carry:+c}_metrics.jsonl" 2>/dev/null
    done
    SAMPLES=$(( ${PROMPTS:-64} * ${N:-8} )) python3 - "$OUT"/loop_*_metrics.jsonl <<'PY'
import json, os, sys
print("run | step | generate tok/s | engine s | engine steps | admissions | model tokens | carried in/out | cut turns | prefilled a model token")
pairs, multi = [], None  # (multi-turn run, its rate, single-turn run, its rate): steps >= 2 (step 1 warms up)
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1].removesuffix("_metrics.jsonl")
    rows = [r for r in (json.loads(l) for l in open(path) if l.strip()) if "timing/generate_tokens_per_s" in r]
    later = [r["timing/generate_tokens_per_s"] for r in rows if r["step"] >= 2]
    rate = sum(later) / len(later) if later else None
    if name.endswith("_single") and multi is not None and rate:
        pairs.append((*multi, name, rate))
    elif not name.endswith("_single"):
        multi = (name, rate) if rate else None
    for r in rows:
        if "rollout/multi_turn/engine_steps" not in r:  # a single-turn run (an s in AGENT_LOOP_ADMITS)
            print(name, r["step"], round(r["timing/generate_tokens_per_s"]),
                  round(r["timing/generate_engine_s"], 2), "-", "-", round(r["response_length/mean"] * int(os.environ["SAMPLES"])),
                  "-", "-", "-", sep=" | ")
            continue
        print(name, r["step"], round(r["timing/generate_tokens_per_s"]),
              round(r["timing/generate_engine_s"], 2), int(r["rollout/multi_turn/engine_steps"]),
              int(r["rollout/multi_turn/engine_admissions"]), int(r["rollout/multi_turn/model_tokens"]),
              f'{int(r.get("rollout/multi_turn/carried_in_groups", 0))}/{int(r.get("rollout/multi_turn/carried_out_groups", 0))}',
              int(r.get("rollout/multi_turn/aborted_turns", 0)),
              round(r.get("rollout/multi_turn/engine_prefilled_per_model_token", float("nan")), 3), sep=" | ")
for m, mr, s1, sr in pairs:
    print(f"pair: {m} {mr:.0f} tok/s against {s1} {sr:.0f} (steps 2+): ratio {mr / sr:.3f}")
PY
    for host in "$OUT"/loop_*/profile/step_*/*_host.txt; do  # trainer.profile.host=true: the step's top Python functions
      [ -e "$host" ] && echo "== $host" && sed -n '1,/Ordered by: cumulative/p' "$host" | head -40
    done
    (cd "$OUT" && tar -czf agent_loops.tgz --exclude=checkpoints --exclude='*.pt' loop_? loop_?.log && rm -rf loop_? loop_?.log)
    return 0
  fi
  env "${common[@]}" timeout 260 bash benchmarks/gpu_grpo.sh "$OUT/grpo_multi_turn" "${multi[@]}" ${AGENT_MT_ARGS:-} \
    > "$OUT/grpo_multi_turn.log" 2>&1
  echo "grpo multi-turn rc=$?"; grep -E "run failed|Error|error:" "$OUT/grpo_multi_turn.log" | tail -3 | cut -c1-400
  local mean
  mean=$(python3 - "$OUT/grpo_multi_turn/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "rollout/multi_turn/model_tokens" in r]
print(round(sum(r["rollout/multi_turn/model_tokens"] / r["rollout/multi_turn/conversations"] for r in rows) / len(rows)))
PY
)
  echo "multi-turn mean model tokens per sample: $mean"
  # AGENT_SINGLE: budget (1, the default): single-turn responses of exactly the mean (ignore_eos: as many tokens as the
  # multi-turn run, issue 37's comparison; before 2026-12-06 evening EOS ended ~1/3 of them early); stop: responses
  # that end at stop token AGENT_SINGLE_STOP (5) within 1024 tokens, a spread like the conversations' (their mean is
  # not matched: the rates are compared); both; 0: none
  local single=${AGENT_SINGLE:-1}
  if [ "$single" = 1 ] || [ "$single" = budget ] || [ "$single" = both ]; then
    env "${common[@]}" timeout ${AGENT_SINGLE_S:-200} bash benchmarks/gpu_grpo.sh "$OUT/grpo_single_turn" \
      rollout.sampling.max_new_tokens="$mean" rollout.sampling.ignore_eos=true > "$OUT/grpo_single_turn.log" 2>&1
    echo "grpo single-turn rc=$?"; grep -E "run failed|Error|error:" "$OUT/grpo_single_turn.log" | tail -3 | cut -c1-400
  fi
  if [ "$single" = stop ] || [ "$single" = both ]; then
    env "${common[@]}" timeout ${AGENT_SINGLE_S:-200} bash benchmarks/gpu_grpo.sh "$OUT/grpo_single_turn_stop" \
      rollout.sampling.max_new_tokens=1024 "rollout.sampling.stop_token_ids=[${AGENT_SINGLE_STOP:-5}]" \
      > "$OUT/grpo_single_turn_stop.log" 2>&1
    echo "grpo single-turn (stop token) rc=$?"; grep -E "run failed|Error|error:" "$OUT/grpo_single_turn_stop.log" | tail -3 | cut -c1-400
  fi
  for kind in multi_turn single_turn single_turn_stop; do
    cp "$OUT/grpo_$kind/metrics.jsonl" "$OUT/grpo_${kind}_metrics.jsonl" 2>/dev/null
  done
  python3 - "$OUT/grpo_multi_turn_metrics.jsonl" "$OUT/grpo_single_turn_metrics.jsonl" "$OUT/grpo_single_turn_stop_metrics.jsonl" <<'PY'
import json, os, sys
keys = ("timing/generate_tokens_per_s", "timing/generate_s", "rollout/multi_turn/model_tokens", "rollout/multi_turn/turns_per_s",
        "rollout/multi_turn/turns_per_conversation", "rollout/multi_turn/engine_idle_frac", "rollout/multi_turn/engine_busy_frac",
        "rollout/multi_turn/tool_latency_mean_s", "rollout/multi_turn/engine_prefix_cached_frac",
        "rollout/logprob_diff_max", "rollout/logprob_diff_mean")
rates = {}
for path in [p for p in sys.argv[1:] if os.path.exists(p)]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    if not rows:
        continue
    print(path.rsplit("/", 1)[-1], "| step | " + " | ".join(k.split("/", 1)[1] for k in keys))
    for r in rows:
        print("", r["step"], *(f"{r[k]:.4g}" if k in r else "-" for k in keys), sep=" | ")
    later = [r["timing/generate_tokens_per_s"] for r in rows if r["step"] > 1]  # step 1 warms up
    last = rows[-1]
    rates[path.rsplit("/", 1)[-1].removeprefix("grpo_").removesuffix("_metrics.jsonl")] = (
        sum(later) / max(len(later), 1), last.get("response_length/mean", 0), last.get("response_length/max", 0))
multi = rates.pop("multi_turn", (None,))[0]
for name, (rate, mean, top) in rates.items():
    if multi and rate:
        print(f"generation tokens/s, steps 2+: multi-turn {multi:.0f}, {name} {rate:.0f} (responses: mean {mean:.0f}, "
              f"max {top:.0f} tokens), ratio {multi / rate:.3f}")
PY
  # at most 8 files come back from $OUT: the runs' folders (configs, trainer.profile's tables and phases; not its
  # timelines or checkpoints) and the logs go into one archive
  for phases in "$OUT"/grpo_*/profile/step_*/*_phases.json; do
    [ -e "$phases" ] && echo "$phases" && python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['phases']))" "$phases"
  done
  (cd "$OUT" && tar -czf agent_runs.tgz --exclude='*.trace.json.gz' --exclude=checkpoints --exclude='*.pt' \
    $(ls -d grpo_multi_turn grpo_single_turn grpo_single_turn_stop ./*.log 2>/dev/null) \
    && rm -rf grpo_multi_turn grpo_single_turn grpo_single_turn_stop ./*.log)
}

setup_sglang() {  # issue 38: megatron from .whl, then the SGLang kit (carried, or installed by an earlier call)
  setup_megatron
  if [ ! -e ~/sglang0517/.ready ]; then
    [ -d .gpu-sglang/part1 ] || { echo "no SGLang kit here: carry .gpu-sglang"; exit 1; }
    [ ! -d .gpu-sglang/part2 ] || { echo "the kit has several parts: this phase expects one (rebuild it)"; exit 1; }
    bash .gpu-sglang/part1/install.sh .gpu-sglang/part1 ~/sglang0517 > "$OUT/sglang_install.log" 2>&1 \
      || { tail -20 "$OUT/sglang_install.log"; exit 1; }
    grep ready "$OUT/sglang_install.log" && touch ~/sglang0517/.ready
  fi
  # SGLang JIT-builds a few kernels (tvm-ffi + nvcc, cached in ~/.cache/tvm-ffi) and links them with -lcudart:
  # give the linker torch's CUDA 13 runtime in case the CUDA install beside nvcc has no unversioned libcudart.so
  local rt; rt=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13/lib/libcudart.so.13'))" 2>/dev/null)
  if [ -n "$rt" ] && [ -e "$rt" ]; then
    mkdir -p /tmp/sgl_cudalib && ln -sf "$rt" /tmp/sgl_cudalib/libcudart.so && export LIBRARY_PATH=/tmp/sgl_cudalib${LIBRARY_PATH:+:$LIBRARY_PATH}
  fi
  # the kit first: its transformers 5.12.1 replaces the image's 5.17 (sglang 0.5.17 does not import under 5.17)
  # flashinfer is in the kit only because SGLang imports it on CUDA: keep SGLang off its JIT-built kernels
  export PYTHONPATH=$HOME/sglang0517/site:/tmp/site:$PWD HF_HUB_OFFLINE=1 SGLANG_IS_FLASHINFER_AVAILABLE=false
}

sglang_grpo() {  # sglang_grpo BACKEND: GRPO on the 0.5B body, 10 steps, log-prob gap every step; the step tables
  local backend=$1
  CUDA_VISIBLE_DEVICES=0 WORK=/tmp/sgl_work SIZE=0.5b STEPS=${STEPS:-10} GAP_FREQ=1 timeout ${GRPO_S:-540} \
    bash benchmarks/gpu_grpo.sh "$OUT/grpo_$backend" rollout.backend=$backend \
    $([ "$backend" = sglang ] && echo rollout.sglang_attention_backend=triton) > "$OUT/grpo_$backend.log" 2>&1
  echo "GRPO (rollout.backend=$backend) rc=$?"; grep -E "Error|error:" "$OUT/grpo_$backend.log" | tail -3 | cut -c1-400
  cp "$OUT/grpo_$backend/metrics.jsonl" "$OUT/grpo_${backend}_metrics.jsonl" 2>/dev/null
  # each call has a fresh $OUT: keep the metrics outside it for the side-by-side on the same machine
  mkdir -p /tmp/sgl_results && cp "$OUT/grpo_${backend}_metrics.jsonl" /tmp/sgl_results/ 2>/dev/null
  python3 - /tmp/sgl_results/grpo_*_metrics.jsonl <<'PY'
import json, sys
keys = ("timing/step_s", "timing/generate_tokens_per_s", "timing/generate_engine_tokens_per_s", "timing/weight_sync_s",
        "rollout/logprob_diff_max", "rollout/logprob_diff_mean", "response_length/mean", "reward/score/mean",
        "actor/grad_norm")  # grad_norm 0: the weights did not change (REWARD=task on a random body)
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    print(path.rsplit("/", 1)[-1], "| step | " + " | ".join(k.split("/", 1)[1] for k in keys))
    for r in rows:
        print("", r["step"], *(f"{r[k]:.4g}" if k in r else "-" for k in keys), sep=" | ")
PY
  # at most 8 files come back from $OUT: the run's folder (config, plan, logs/ranks.log) and its log in one archive;
  # a failed run's ranks.log tail here
  [ -s "$OUT/grpo_${backend}_metrics.jsonl" ] || tail -25 "$OUT/grpo_$backend/logs/ranks.log" 2>/dev/null | cut -c1-300
  (cd "$OUT" && tar -czf "grpo_${backend}_run.tgz" --exclude=checkpoints --exclude='*.pt' "grpo_$backend" "grpo_$backend.log" \
    && rm -rf "grpo_$backend" "grpo_$backend.log")
}

run_sglang() {  # issue 38: the SGLang rollout backend on one GPU
  case "${1:?sglang tests|grpo|vllm}" in
    tests) setup_sglang
      CUDA_VISIBLE_DEVICES=0 timeout ${TEST_S:-540} python3 -m pytest -q -s -p no:cacheprovider -m gpu \
        tests/gpu/test_rollout_sglang_gpu.py > "$OUT/sglang_gpu_tests.log" 2>&1; echo "SGLang GPU tests rc=$?"
      grep -E "passed|failed|skipped|Error|assert|^[{]" "$OUT/sglang_gpu_tests.log" | cut -c1-600 | tail -12 ;;
    grpo) setup_sglang; sglang_grpo sglang ;;
    vllm) setup_python; sglang_grpo vllm ;;  # the side-by-side row (beside grpo_sglang's, kept in /tmp/sgl_results)
    *) echo "sglang tests|grpo|vllm" >&2; exit 2 ;;
  esac
}

case "$phase" in
  sglang) run_sglang "${2:-}" ;;
  stash) mkdir -p ~/gvk && cp .gpu-vllm/part1/* ~/gvk/ && ls -la ~/gvk ;;
  stash_peers) mkdir -p ~/peers_stash && cp -r .gpu-ray .gpu-peers ~/peers_stash/ && du -sh ~/peers_stash ;;  # for peers_verl
  stash_moe) mkdir -p ~/gvk && cp .gpu-moe/* ~/gvk/ && ls -la ~/gvk ;;  # when moe runs in a fresh machine
  grpo21) run_grpo21 "${2:-0.4}" ;;
  bench14) run_bench14 ;;
  launchers) run_launchers ;;
  main) run_main ;;
  train) run_train ;;
  transfer) run_transfer ;;
  offpolicy) run_offpolicy ;;
  moe) run_moe ;;
  dsv3) run_dsv3 ;;
  reference) run_reference ;;
  profile) run_profile ;;
  mfu) run_mfu ;;
  breakdown) run_breakdown ;;
  logprobs39) run_logprobs39 "${2:-}" ;;
  syncloop)  # after `stash`, carry .gpu-vllm/part2 + .whl: the sync in place vs through buckets, after each kind of
    # sleep (SYNC_MODES=none skips it), then the breakdown with the weights kept (SPEED_S=0 skips its vLLM-alone run)
    setup_python; [ "${SYNC_MODES:-}" = none ] || sync_after_sleep ${SYNC_MODES:-local,local_buckets} awake,keep,level2; KEEP_WEIGHTS=${KEEP_WEIGHTS:-true} run_breakdown ;;
  validate) run_validate ;;
  checks14)  # after `stash`, carry .gpu-vllm/part2 + .whl (2026-12-02, sixth session): the sync after each kind of
    # sleep (in place vs buckets), the GRPO-with-validation test at sleep level 2 and with the weights kept, then vLLM
    # alone on breakdown's model and batch, 3 repeats (run `breakdown` right after, on the same machine)
    setup_python; sync_after_sleep local,local_buckets awake,keep,level2
    CUDA_VISIBLE_DEVICES=0 timeout ${TEST_S:-330} python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_grpo_memory.py \
      -k after_validation > "$OUT/after_validation.log" 2>&1; echo "after-validation GPU test rc=$?"
    grep -E "passed|failed|Error|assert" "$OUT/after_validation.log" | cut -c1-600 | tail -8
    standalone_repeats 3 ${SPEED_S:-200} ;;
  confirm14)  # after `stash`, carry .gpu-vllm/part2 + .whl (2026-12-02, seventh session): the kept-weights sync benchmark
    # and vLLM alone (REPEATS, default 3) on breakdown's model and batch; then, right after on the same machine:
    # SYNC_MODES=none KEEP_WEIGHTS=true GAP_FREQ=0 STEPS=4 syncloop
    setup_python; sync_after_sleep local awake,keep
    standalone_repeats ${REPEATS:-3} ${SPEED_S:-300} ;;
  final14)  # after `stash`, carry .gpu-vllm/part2 + .whl (2026-12-03): what the memory readings cost on this host,
    # then the 256 x 8 x 1024 loop with the weights kept (STEPS, default 3) and vLLM alone on the loop's own first
    # batch of prompts, SPEED_REPEATS (default 3) times
    setup_python; memory_call_costs
    STEPS=${STEPS:-3} GAP_FREQ=${GAP_FREQ:-0} KEEP_WEIGHTS=true SPEED_REPEATS=${SPEED_REPEATS:-3} SPEED_S=${SPEED_S:-200} run_breakdown ;;
  sync14)  # after `stash`, carry .gpu-vllm/part2 + .whl (2026-12-03): the memory readings' cost and check, a short
    # GRPO loop of the 1.5B body with the weights kept (its sync is the same 2.62 GB copy as at 256 x 8 x 1024), then the
    # sync benchmark (awake, weights kept) on the same machine
    setup_python; memory_call_costs
    CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_memory_readings_gpu.py 2>&1 | tail -1
    CUDA_VISIBLE_DEVICES=0 WORK=/tmp/bd_work SIZE=1.5b PROMPTS=32 N=4 MAX_NEW=128 MICRO=16 STEPS=${STEPS:-4} GAP_FREQ=0 \
      timeout ${GRPO_S:-200} bash benchmarks/gpu_grpo.sh "$OUT/sync14" rollout.sleep_level=2 rollout.keep_weights_on_gpu=true \
      > "$OUT/sync14.log" 2>&1; echo "loop rc=$?"
    cp "$OUT/sync14/metrics.jsonl" "$OUT/sync14_metrics.jsonl" 2>/dev/null
    python3 - "$OUT/sync14_metrics.jsonl" <<'PY'
import json, sys
print("step | weight_sync_s | wake_s | load_s | GB | s/GB (phase) | s/GB (wake + load)")
for r in (json.loads(line) for line in open(sys.argv[1]) if line.strip()):
    if "timing/weight_sync_s" in r:
        gb = r["rollout/sync_bytes"] / 1e9; parts = r["timing/weight_sync_wake_s"] + r["timing/weight_sync_load_s"]
        print(r["step"], *(f"{v:.4f}" for v in (r["timing/weight_sync_s"], r["timing/weight_sync_wake_s"],
              r["timing/weight_sync_load_s"], gb, r["timing/weight_sync_s"] / gb, parts / gb)), sep=" | ")
PY
    sync_after_sleep local awake,keep ;;
  moe_experts)  # carry .whl only (2026-12-03): routed experts as grouped GEMMs (moe.grouped_gemm) vs megatron's
    # SequentialMLP: one experts module (two shapes, even and skewed load), then the MoE body's train step each way
    setup_megatron
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu/test_grouped_experts_gpu.py \
      2>&1 | grep -E "error vs fp32|passed|failed|Error" | cut -c1-300 | sort -u | head -12
    CUDA_VISIBLE_DEVICES=0 timeout ${MOE_S:-400} python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
      benchmarks/moe_experts.py --out "$OUT/moe_experts.json" > "$OUT/moe_experts.log" 2>&1; echo "moe_experts rc=$?"
    grep -E "Error|error:" "$OUT/moe_experts.log" | tail -3 | cut -c1-400
    sed -n '/^shape | skewed/,$p' "$OUT/moe_experts.log" ;;
  demo) shift; run_demo "$@" ;;
  peers_verl_mp|peers_trl|peers_verl) run_peers "${phase#peers_}" ;;
  peers_wait) peers_wait ;;
  agent) run_agent ;;
  memory)  # planner vs measured engine memory; needs only .whl (megatron-core, omegaconf), no vLLM
    setup_megatron
    CUDA_VISIBLE_DEVICES=0 timeout 540 python3 benchmarks/engine_memory.py --out "$OUT/engine_memory.json" \
      2>&1 | grep -E '^[{]|Error' ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
