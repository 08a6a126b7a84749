#!/usr/bin/env bash
# Prepare what scripts/gpu-smoke.sh needs on the GPU machine (Python 3.12, no network there):
# TensorRT-RTX wheels, polygraphy and onnx-graphsurgeon as cp312 wheels, the RTX libs wheel
# (95 MB) split in two halves because one transfer carries at most 64 MiB.
#   .gpu-carry-a/  first half of the libs wheel + the small wheels   (carry in call 1)
#   .gpu-carry-b/  second half of the libs wheel                      (carry in call 2)
# Both folders are git-ignored. Run from the repository root.
set -euo pipefail
RTX_VERSION=${RTX_VERSION:-1.7.1.116}
work=$(mktemp -d)
pip_download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work" "$@"
}
pip_download "tensorrt-rtx-cu13-libs==$RTX_VERSION" "tensorrt-rtx-cu13-bindings==$RTX_VERSION"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" polygraphy onnx-graphsurgeon
rm -rf .gpu-carry-a .gpu-carry-b
mkdir -p .gpu-carry-a .gpu-carry-b
libs=$(ls "$work"/tensorrt_rtx_cu13_libs-*.whl)
split -b 48M "$libs" "$work/libs.part."
mv "$work/libs.part.aa" .gpu-carry-a/
mv "$work/libs.part.ab" .gpu-carry-b/
basename "$libs" > .gpu-carry-a/libs.name
sha256sum "$libs" | cut -d' ' -f1 > .gpu-carry-a/libs.sha256
mv "$work"/*.whl .gpu-carry-a/ 2>/dev/null || true
rm -f ".gpu-carry-a/$(basename "$libs")"
du -sh .gpu-carry-a .gpu-carry-b
ls -la .gpu-carry-a .gpu-carry-b
