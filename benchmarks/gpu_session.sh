#!/usr/bin/env bash
# One GPU session on the H200 machine (see benchmarks/README.md). Phases, each one call:
#   kernels : carry .gpu-vllm/part1; stash it in ~/gvk; time the Triton kernels.
#   main    : carry .gpu-vllm/part2 and .whl; install megatron-core/omegaconf + vLLM 0.26;
#             run the gpu tests and the 1.5B weight-sync benchmark (1 and 2 GPUs).
#   big     : (same machine, right after main) the 7B weight-sync benchmark.
# Logs and JSON results go to $OUT.
set -uo pipefail
phase=${1:?usage: gpu_session.sh kernels|main|big}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0
OUT=${OUT:-/tmp/out}
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

setup_python() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  if [ ! -d ~/vllm026/site ]; then
    cp .gpu-vllm/part2/* ~/gvk/ && bash ~/gvk/install.sh ~/gvk ~/vllm026 > "$OUT/vllm_install.log" 2>&1 || { tail -20 "$OUT/vllm_install.log"; exit 1; }
  fi
  export PYTHONPATH=/tmp/site:~/vllm026/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
}

case "$phase" in
kernels)
  mkdir -p ~/gvk && cp .gpu-vllm/part1/* ~/gvk/
  PYTHONPATH=$PWD python3 benchmarks/kernels.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" | tail -25
  ;;
main)
  setup_python
  timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\{|passed|failed|Error" | tail -20
  for n in 1 2; do
    [ "$n" -le "$ngpu" ] || continue
    timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node $n benchmarks/weight_sync.py \
      --size 1.5b --out "$OUT/sync_1.5b_tp$n.json" > "$OUT/sync_1.5b_tp$n.log" 2>&1; echo "sync 1.5b tp$n rc=$?"
    grep -E '^\{' "$OUT/sync_1.5b_tp$n.log" | tail -1
  done
  ;;
big)
  setup_python
  for n in 1 2; do
    [ "$n" -le "$ngpu" ] || continue
    timeout 280 python3 -m torch.distributed.run --standalone --nproc-per-node $n benchmarks/weight_sync.py \
      --size 7b --out "$OUT/sync_7b_tp$n.json" > "$OUT/sync_7b_tp$n.log" 2>&1; echo "sync 7b tp$n rc=$?"
    grep -E '^\{' "$OUT/sync_7b_tp$n.log" | tail -1
  done
  ;;
esac
