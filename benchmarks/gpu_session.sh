#!/usr/bin/env bash
# One GPU session on the H200 machine, in two back-to-back calls (vLLM comes in 2 parts):
#   stash : carry .gpu-vllm/part1; keep it in ~/gvk (outside the checkout).
#   main  : carry .gpu-vllm/part2 and .whl; install megatron-core/omegaconf + vLLM 0.26;
#           run the gpu tests (colocated local sync, sleep/wake) at TP 1 and 2 and time the
#           1-GPU weight syncs (1.5B and 7B shapes, gather and local modes).
#   bench2: (right after main, same carry) the 2-GPU weight syncs; EXTRA_TESTS=... more gpu tests.
#   memory: (carry .whl only) benchmarks/engine_memory.py: planner vs measured train-step/log-prob peaks.
#   train : (after stash, same carry as main) the fused-kernel engine test, a 4-step GRPO run of
#           the real trainer (benchmarks/gpu_grpo.sh; GRPO_GPUS=0,1 SIZE=1.5b NPROC=2 TP=2 for
#           two GPUs), the 7B 1-GPU sync; SKIP_KERNEL=1 / SKIP_BENCH=1 leave parts out.
# Logs and JSON results go to $OUT.
set -uo pipefail
phase=${1:?usage: gpu_session.sh stash|main}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
OUT=${OUT:-/tmp/out}
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

setup_python() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  if [ ! -d ~/vllm026/site ]; then
    cp .gpu-vllm/part2/* ~/gvk/ && bash ~/gvk/install.sh ~/gvk ~/vllm026 > "$OUT/vllm_install.log" 2>&1 \
      || { tail -20 "$OUT/vllm_install.log"; exit 1; }
  fi
  export PYTHONPATH=/tmp/site:$HOME/vllm026/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
}

bench() {  # bench SIZE NGPU [CUDA_VISIBLE_DEVICES]: both sync modes, one process
  CUDA_VISIBLE_DEVICES=${3:-0,1} timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node "$2" \
    benchmarks/weight_sync.py --size "$1" --modes gather,local --out "$OUT/sync_$1_tp$2.json" \
    > "$OUT/sync_$1_tp$2.log" 2>&1
  echo "sync $1 tp$2 rc=$?"; grep -E '^[{]' "$OUT/sync_$1_tp$2.log" | cut -c1-400
}

run_main() {  # 1-GPU test on GPU 0 while GPU 1 times the 1-GPU syncs; then the TP=2 test
  setup_python
  [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches  # the editable install maps it; here no install
  (CUDA_VISIBLE_DEVICES=0 timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_runtime_cuda.py \
    tests/gpu/test_rollout_gpu.py -k "tp1pp1 or runtime" -s > "$OUT/gpu_tests_tp1.log" 2>&1; echo "tp1 tests rc=$?") &
  bench 1.5b 1 1; bench 7b 1 1
  wait; grep -E "^[{]|passed|failed|Error" "$OUT/gpu_tests_tp1.log" | cut -c1-600 | tail -6
  [ "$ngpu" -ge 2 ] || return 0
  timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_rollout_gpu.py -k tp2pp1 -s \
    > "$OUT/gpu_tests_tp2.log" 2>&1; echo "tp2 test rc=$?"
  grep -E "^[{]|passed|failed|Error" "$OUT/gpu_tests_tp2.log" | cut -c1-600 | tail -6
}

run_bench2() {  # the 2-GPU syncs, plus any extra GPU tests named in $EXTRA_TESTS on the side
  setup_python
  [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches
  bench 1.5b 2; bench 7b 2
  if [ -n "${EXTRA_TESTS:-}" ]; then
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $EXTRA_TESTS -s > "$OUT/gpu_extra.log" 2>&1
    echo "extra tests rc=$?"; grep -E "^[{]|passed|failed|Error" "$OUT/gpu_extra.log" | cut -c1-600 | tail -8
  fi
}

run_train() {  # the fused-kernel engine test, a GRPO run of the real trainer on 1 GPU, the 7B sync again
  setup_python
  [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches
  if [ -z "${SKIP_KERNEL:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_engine_kernel_gpu.py \
      -s > "$OUT/gpu_kernel.log" 2>&1; echo "kernel test rc=$?"
    grep -E "^[{]|ms|GiB|passed|failed|Error" "$OUT/gpu_kernel.log" | cut -c1-300 | tail -8
  fi
  CUDA_VISIBLE_DEVICES=${GRPO_GPUS:-0} timeout 330 bash benchmarks/gpu_grpo.sh "$OUT/grpo" > "$OUT/grpo.log" 2>&1
  echo "grpo rc=$?"; grep -E "step [0-9]|Error|error:" "$OUT/grpo.log" | cut -c1-400 | tail -8
  [ -n "${SKIP_BENCH:-}" ] || bench 7b 1 0
  [ -n "${SKIP_BENCH:-}" ] || { CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/seed_scope.py --prompts 256 \
    --max-new-tokens 256 > "$OUT/seed_scope.log" 2>&1; echo "seed scope rc=$?"; grep -E '^[{]' "$OUT/seed_scope.log"; }
}

case "$phase" in
  quick)  # tight budget: the 1-GPU test on GPU 0 while GPU 1 times the sync
    setup_python
    [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches
    (CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_rollout_gpu.py \
      -k tp1pp1 -s > "$OUT/gpu_tests.log" 2>&1; echo "gpu test rc=$?") &
    for size in 1.5b 7b; do
      CUDA_VISIBLE_DEVICES=1 timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 1 \
        benchmarks/weight_sync.py --size $size --out "$OUT/sync_${size}_tp1.json" > "$OUT/sync_${size}_tp1.log" 2>&1
      echo "sync $size rc=$?"; grep -E '^[{]' "$OUT/sync_${size}_tp1.log" | tail -1
    done
    wait; grep -E "^[{]|passed|failed" "$OUT/gpu_tests.log" | tail -5 ;;
  stash) mkdir -p ~/gvk && cp .gpu-vllm/part1/* ~/gvk/ && ls -la ~/gvk ;;
  main) run_main ;;
  bench2) run_bench2 ;;
  train) run_train ;;
  memory)  # planner vs measured engine memory; needs only .whl (megatron-core, omegaconf), no vLLM
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || exit 1
    export PYTHONPATH=/tmp/site:$PWD
    [ -e verl_mp/patches ] || ln -s ../patches verl_mp/patches
    CUDA_VISIBLE_DEVICES=0 timeout 540 python3 benchmarks/engine_memory.py --out "$OUT/engine_memory.json" \
      2>&1 | grep -E '^[{]|Error' ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
