#!/usr/bin/env bash
# Build, on a CPU machine with package-registry access, an offline SGLang 0.5.23 kit for the GPU
# machine (Python 3.12, torch 2.11.0+cu130, no network, at most 64 MiB carried per call).
# NOT YET RUN ON A GPU. sglang 0.5.23 pins torch==2.14.1 and its kernels (sglang-kernel 0.4.10)
# are linked against torch 2.14.1: five libtorch/c10 symbols they need are not exported by the
# image's torch 2.11 (checked with nm), so the kit must also bring torch 2.14.1 and the Triton it
# pins (3.8). That is the bulk: measured 2026-12-05, docs/rollout.md.
# Part "sglang": sglang + sgl_kernel without FA3 (flash_ops, 1.1 GB; run with
# rollout.sglang_attention_backend=triton), FlashMLA, InfLLM and sm100 kernels + the wheels in
# requirements.txt. Parts "torch": torch 2.14.1 and triton 3.8. All split into 60 MiB parts.
# Usage: build.sh OUT_DIR      -> OUT_DIR/part1/ ... partN/ (+ install.sh in the last)
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 39 38 37 36 35 34 33 32 31 28 27 26 24 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p "$work/kit/site" "$work/kit/wheels"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/dl" sglang==0.5.23 sglang-kernel==0.4.10 \
  torch==2.14.1 "triton==3.8.*"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/kit/wheels" -r "$here/requirements.txt"
for w in "$work"/dl/sglang-0.5.23-*.whl "$work"/dl/sglang_kernel-0.4.10-*.whl "$work"/dl/torch-2.14.1-*.whl \
         "$work"/dl/triton-3.8.*.whl; do
  python3 -m zipfile -e "$w" "$work/kit/site"
done
k="$work/kit/site/sgl_kernel"
# Not used by a dense model on sm_90 with the triton attention backend: FA3 (flash_ops), FlashMLA,
# InfLLM, the Blackwell (sm100) build.
rm -f "$k/flash_ops.abi3.so" "$k"/infllm_ops.*.so "$k/flashmla_ops.abi3.so"
rm -rf "$k/sm100" "$work/kit/site/bin"
tar -C "$work" -cf - kit | xz -T2 -9 -c > "$work/kit.tar.xz"
mkdir -p "$out"
split -b 60m -d -a 2 "$work/kit.tar.xz" "$work/kit.tar.xz.part"
n=0
for p in "$work"/kit.tar.xz.part*; do
  n=$((n + 1)); mkdir -p "$out/part$n"; mv "$p" "$out/part$n/"
done
cp "$here/install.sh" "$out/part$n/"
du -sh "$out"/part*
echo "built $n parts in $out (each call carries one; stash parts 1..$((n - 1)) outside the checkout)"
