#!/usr/bin/env bash
# Build, on a CPU machine with package-registry access, an offline SGLang 0.5.17 kit for the GPU
# machine (Python 3.12, torch 2.11.0+cu130, Triton 3.6, CUDA 13, no network, at most 64 MiB carried
# per call). sglang 0.5.17 pins torch==2.11.0 and sglang-kernel==0.4.5, whose default (PyPI) build
# links CUDA 13 and needs only libtorch/c10 symbols the image's torch 2.11.0 exports (checked with
# nm -D, docs/rollout.md): the image's torch, Triton and CUDA libraries are used as they are.
# Left out (not used by a dense model on sm_90 with the triton attention backend; run with
# rollout.sglang_attention_backend=triton): sgl_kernel's FA3 (flash_ops, 1.1 GB), FlashMLA, InfLLM
# (a cp310 build) and its Blackwell (sm100) library; xgrammar's static library; torch_memory_saver's
# CUDA 12 builds; sglang's Rust HTTP server, gRPC and multimodal
# native modules and its diffusion package (multimodal_gen). Wheels are unpacked before xz (xz over
# deflated wheels gains little). Run SGLang from it with SGLANG_IS_FLASHINFER_AVAILABLE=false
# (flashinfer is only imported; its kernels would be JIT-built with nvcc on first use).
# Usage: build.sh OUT_DIR      -> OUT_DIR/part1/ ... partN/ (+ install.sh in the last)
# WHEEL_CACHE=DIR: take wheels found in DIR instead of downloading them (sglang-kernel is 383 MB).
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
for n in 39 38 37 36 35 34 33 32 31 28 27 26 24 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {  # fetch DEST ARGS...: pip download --no-deps, from WHEEL_CACHE first when given
  local dest=$1; shift
  if [ -n "${WHEEL_CACHE:-}" ] && python3 -m pip download -q --no-deps "${plat[@]}" --no-index \
       --find-links "$WHEEL_CACHE" -d "$dest" "$@" 2>/dev/null; then return; fi
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$dest" "$@"
}
fetch "$work/dl" sglang==0.5.17 sglang-kernel==0.4.5
fetch "$work/dl" -r "$here/requirements.txt"
mkdir -p "$work/kit/site"
for w in "$work"/dl/*.whl; do python3 -m zipfile -e "$w" "$work/kit/site"; done
s="$work/kit/site"
# wheels' .data: only scripts and man pages here (dill, ipython); code there would need installing
if ls -d "$s"/*.data/purelib "$s"/*.data/platlib >/dev/null 2>&1; then echo "a wheel has code in .data" >&2; exit 1; fi
rm -rf "$s"/*.data
rm -f "$s/sgl_kernel/flash_ops.abi3.so" "$s/sgl_kernel/flashmla_ops.abi3.so" "$s"/sgl_kernel/infllm_ops.*.so
rm -rf "$s/sgl_kernel/sm100" "$s/sglang/multimodal_gen" "$s/bin"
# xgrammar's static library (65 MB, for C++ builds against it; Python loads libxgrammar_bindings.so);
# torch_memory_saver's CUDA 12 builds (it loads the _cu13 one under torch's CUDA 13)
rm -f "$s/xgrammar/lib/libxgrammar.a" "$s"/torch_memory_saver_hook_mode_*_cu12.abi3.so \
  "$s/torch_memory_saver_hook_mode_preload.abi3.so" "$s/torch_memory_saver_hook_mode_torch.abi3.so"
rm -f "$s"/sglang/srt/server/_core.*.so "$s"/sglang/srt/grpc/_core.*.so "$s"/sglang/srt/multimodal/_core.*.so
find "$s" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$s"
tar -C "$work" -cf - kit | nice -n 19 xz -T1 -9 -c > "$work/kit.tar.xz"
ls -l "$work/kit.tar.xz"
rm -rf "$out"; mkdir -p "$out"
split -b 60m -d -a 2 "$work/kit.tar.xz" "$work/kit.tar.xz.part"
n=0
for p in "$work"/kit.tar.xz.part*; do
  n=$((n + 1)); mkdir -p "$out/part$n"; mv "$p" "$out/part$n/"
done
cp "$here/install.sh" "$out/part$n/"
du -sh "$out"/part*
echo "built $n part(s) in $out$([ $n -gt 1 ] && echo ": benchmarks/gpu_session.sh expects one, rebuild smaller")"
