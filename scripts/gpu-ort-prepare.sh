#!/usr/bin/env bash
# Prepare the onnxruntime-gpu device run (docs/gpu.md, "Device recipe"), here, from the repo root:
# the cp312/manylinux_2_28 onnxruntime-gpu wheel (the CUDA 13 build, ~255 MB) split into parts
# of 58 MiB, one per git-ignored folder .gpu-carry-1 … .gpu-carry-N, because one device call
# carries at most 64 MiB with the working tree. The last folder also holds the small wheels the
# device image lacks (polygraphy, onnx-graphsurgeon) and the third-party models of the suite
# (PP-OCRv4 det/rec from rapidocr-onnxruntime, YOLOv8n from nudenet), with a manifest of names
# and checksums. Then, with the device tool, calls right after each other (a warm machine keeps
# /tmp for about 30 s):
#   carry [".gpu-carry-1"], command "bash scripts/gpu-ort-suite.sh part"
#   …                                                   (one call per folder but the last)
#   carry [".gpu-carry-N"], command "bash scripts/gpu-ort-suite.sh run"
set -euo pipefail
ORT_VERSION=${ORT_VERSION:-1.31.1}
NUDENET_VERSION=${NUDENET_VERSION:-3.4.2}
work=${WORK:-$(mktemp -d)}
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$work" "$@"
}
[ -n "$(ls "$work"/onnxruntime_gpu-"$ORT_VERSION"-*.whl 2>/dev/null)" ] || download "onnxruntime-gpu==$ORT_VERSION"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" polygraphy onnx-graphsurgeon
[ -n "$(ls "$work"/nudenet-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps -d "$work" "nudenet==$NUDENET_VERSION"
wheel=$(ls "$work"/onnxruntime_gpu-"$ORT_VERSION"-*.whl)
rm -rf .gpu-carry-[0-9]*
split -b 58M -d -a 1 "$wheel" "$work/ortgpu.part."
parts=("$work"/ortgpu.part.*)
n=${#parts[@]}
for i in "${!parts[@]}"; do
  mkdir -p ".gpu-carry-$((i + 1))"
  mv "${parts[$i]}" ".gpu-carry-$((i + 1))/"
done
last=".gpu-carry-$n"
mkdir -p "$last/wheels" "$last/models"
basename "$wheel" > "$last/wheel.name"
sha256sum "$wheel" | cut -d' ' -f1 > "$last/wheel.sha256"
echo "$n" > "$last/parts.count"
cp "$work"/polygraphy-*.whl "$work"/onnx_graphsurgeon-*.whl "$last/wheels/"
ocr=$(python3 -c "import os, rapidocr_onnxruntime as r; print(os.path.join(os.path.dirname(r.__file__), 'models'))")
cp "$ocr/ch_PP-OCRv4_det_infer.onnx" "$ocr/ch_PP-OCRv4_rec_infer.onnx" "$last/models/"
unzip -o -q -j "$(ls "$work"/nudenet-*.whl)" 'nudenet/320n.onnx' -d "$last/models/"
mv "$last/models/320n.onnx" "$last/models/yolov8n_nudenet_320n.onnx"
(cd "$last/models" && sha256sum ./*.onnx > SHA256SUMS)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for folder in .gpu-carry-*; do
  size=$(du -sb "$folder" | cut -f1)
  total=$((size + tree))
  printf '%s\t%d bytes (+ tracked tree %d = %d of 67108864)\n' "$folder" "$size" "$tree" "$total"
  [ "$total" -lt 67108864 ] || { echo "too big for one device call: $folder"; exit 1; }
done
