#!/usr/bin/env bash
# Prepare here (CPU, network for pip) what scripts/gpu-buildcost.sh measures on the GPU machine:
# the ONNX files (bench/trt_buildcost_prepare.py), xz-compressed (packs repeat their weights: a
# 128 MiB dictionary stores them once), the TensorRT-RTX libs wheel in two halves, spread over
# three git-ignored carry folders that each fit one transfer (64 MiB with the tracked tree).
# Run from the repository root; RTX_VERSION picks the wheel. Then the three device calls that
# scripts/gpu-buildcost.sh names, right after each other.
set -euo pipefail
RTX_VERSION=${RTX_VERSION:-1.7.1.116}
CASES=${CASES:-$(mktemp -d)/cases}
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work" "tensorrt-rtx-cu13-libs==$RTX_VERSION" "tensorrt-rtx-cu13-bindings==$RTX_VERSION"
python3 bench/trt_buildcost_prepare.py "$CASES"
base=$(dirname "$CASES")
name=$(basename "$CASES")
tar -C "$base" -cf - "$name" | xz -T2 -6 --lzma2=dict=128MiB > "$work/cases.tar.xz"
rm -rf .gpu-carry-h39a .gpu-carry-h39b .gpu-carry-h39c
mkdir -p .gpu-carry-h39a .gpu-carry-h39b .gpu-carry-h39c
libs=$(ls "$work"/tensorrt_rtx_cu13_libs-*.whl)
(cd "$work" && sha256sum "$(basename "$libs")") > .gpu-carry-h39a/libs.sha256
split -b 48M "$libs" "$work/libs.part."
mv "$work/libs.part.aa" .gpu-carry-h39a/
mv "$work/libs.part.ab" .gpu-carry-h39b/
mv "$work"/tensorrt_rtx_cu13_bindings-*.whl .gpu-carry-h39a/
# the cases archive fills what the wheel halves leave: 8 MB, 14 MB, the rest
head -c 8000000 "$work/cases.tar.xz" > .gpu-carry-h39a/cases.part.aa
tail -c +8000001 "$work/cases.tar.xz" | head -c 14000000 > .gpu-carry-h39b/cases.part.ab
tail -c +22000001 "$work/cases.tar.xz" > .gpu-carry-h39c/cases.part.ac
for d in a b c; do cp scripts/gpu-buildcost.sh bench/trt_buildcost.py ".gpu-carry-h39$d/"; done
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
for d in a b c; do
  size=$(du -sb ".gpu-carry-h39$d" | cut -f1)
  echo ".gpu-carry-h39$d: $size bytes (+ tracked tree $tree; limit 67108864)"
  [ $((size + tree)) -lt 67108864 ] || { echo "too large for one transfer"; exit 1; }
done
