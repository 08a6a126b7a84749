#!/usr/bin/env bash
# The memory bound on GPU engine workers, measured on the device (docs/gpu.md, "Memory bound on GPU
# engines"; scripts/gpu_memory_bound.py does the measuring). Here first: bash scripts/gpu-prepare.sh (the
# TensorRT-RTX halves, .gpu-carry-a/-b), the onnxruntime-gpu wheel split by 52 MiB into .gpu-carry-0hgpu-1 … -5
# (58 MiB parts no longer fit one call beside the tracked tree), its name and SHA-256 and the code under
# test (src/reprokit, src/scripts) in CARRY (default .gpu-carry-0hgpu). Then device calls in a row (a warm
# machine keeps /tmp about 30 s between calls):
#   carry .gpu-carry-0hgpu-1 … -4:       bash scripts/gpu-memory-bound.sh part   (from CARRY/src/scripts)
#   carry .gpu-carry-a:                 … stash
#   carry .gpu-carry-0hgpu-5 and CARRY:  … ort
#   carry .gpu-carry-b and CARRY:       … trt
# Results: $OUT/<mode>.jsonl and $OUT/<mode>.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
CARRY=${CARRY:-.gpu-carry-0hgpu}
root=$(pwd)
src="$root/$CARRY/src"
mode=${1:?part, stash, ort or trt}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
mkdir -p /tmp/hgpu-parts
for part in .gpu-carry-0hgpu-*/ortgpu.part.*; do [ -f "$part" ] && cp "$part" /tmp/hgpu-parts/; done
case $mode in
part) ls -la /tmp/hgpu-parts ;;
stash)  # the first TensorRT-RTX half waits in /tmp for the call that carries the second
  rm -rf /tmp/rtx-a && cp -r .gpu-carry-a /tmp/rtx-a && ls -la /tmp/rtx-a
  ;;
ort)
  if [ ! -d /tmp/ortgpu-site/onnxruntime ]; then
    wheel="/tmp/$(cat "$CARRY/wheel.name")"
    cat /tmp/hgpu-parts/ortgpu.part.* > "$wheel"
    echo "$(cat "$CARRY/wheel.sha256")  $wheel" | sha256sum -c - || exit 3
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ortgpu-site "$wheel" || exit 3
  fi
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  PYTHONPATH=/tmp/ortgpu-site python3 -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())'
  PYTHONPATH="/tmp/ortgpu-site:$src" python3 "$src/scripts/gpu_memory_bound.py" all --out /tmp/gmb-ort \
    --targets ort:cuda --bombs --samples "$root/samples" --candidate "$src" --old "$root" "$@" 2>&1 | tee "$OUT/ort.log"
  cp /tmp/gmb-ort/gpu_memory_bound.jsonl "$OUT/ort.jsonl"
  ;;
trt)
  site=/tmp/rtx-site
  if [ ! -d "$site/tensorrt_rtx_libs" ]; then
    libs="/tmp/$(cat /tmp/rtx-a/libs.name)"
    cat /tmp/rtx-a/libs.part.* .gpu-carry-b/libs.part.* > "$libs"
    echo "$(cat /tmp/rtx-a/libs.sha256)  $libs" | sha256sum -c - || exit 3
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$libs" /tmp/rtx-a/*.whl || exit 3
  fi
  cudart=$(python3 -c 'import glob, os, site; print(":".join(sorted({os.path.dirname(p) for b in site.getsitepackages() for p in glob.glob(os.path.join(b, "nvidia", "**", "libcudart.so*"), recursive=True)})))')
  export LD_LIBRARY_PATH="${cudart}:${LD_LIBRARY_PATH:-}" POLYGRAPHY_USE_TENSORRT_RTX=1
  PYTHONPATH="$site:$src" python3 -m reprokit backends 2>&1 | grep -i trt
  PYTHONPATH="$site:$src" python3 "$src/scripts/gpu_memory_bound.py" all --out /tmp/gmb-trt \
    --targets trt --samples "$root/samples" --models attention_softmax_nan conv_clip --bounds-gib 4 2 1 \
    --candidate "$src" --old "$root" "$@" 2>&1 | tee "$OUT/trt.log"
  cp /tmp/gmb-trt/gpu_memory_bound.jsonl "$OUT/trt.jsonl"
  ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
