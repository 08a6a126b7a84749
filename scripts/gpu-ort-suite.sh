#!/usr/bin/env bash
# The onnxruntime-gpu suite on the device (docs/gpu.md). Prepare here: bash scripts/gpu-ort-prepare.sh.
#   bash scripts/gpu-ort-suite.sh part      copy the carried part(s) to /tmp (calls 1 … N-1)
#   bash scripts/gpu-ort-suite.sh run [PHASE …]
#        join and install (once per machine), then the phases (default: all, in this order):
#        info      nvidia-smi, reprokit backends / env, the library versions
#        fidelity  check every model of bench/gpu_suite.py under ort:cuda, ort:cuda,fp16, emulate:fp16,
#                  ort:cuda,bf16, emulate:bf16 (with the gpu tests, pytest -m gpu, beside it)
#        shrink    shrink + verify (+ audit) under ort:cuda,fp16 on the models that diverge
#        keep      fp32-nodes on the samples: fault node alone, catalog keep_fp32 (kernels, emulator)
#        explain   check --layerwise under kernels and emulator where the emulator missed
#        fallback  the CPU-fallback refusal: the CUDA provider with cuBLAS, then cuDNN, hidden
# Results: $OUT/suite.log and $OUT/results.tgz (what the device tool brings back).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
PARTS=/tmp/ortgpu-parts
SITE=/tmp/ortgpu-site
WORK=/tmp/ortgpu-work
mkdir -p "$OUT" "$PARTS" "$WORK"
root=$(pwd)
mode=${1:-run}
shift || true
for part in .gpu-carry-*/ortgpu.part.*; do
  [ -f "$part" ] && cp "$part" "$PARTS/"
done
if [ "$mode" = part ]; then
  ls -la "$PARTS"
  exit 0
fi
exec > >(tee -a "$OUT/suite.log") 2>&1
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $(date +%T) [$SECONDS s] $*"; }
pack() { tar -C "$WORK" --exclude='*.onnx' --exclude='*.npz' --exclude='.reprokit' -czf "$OUT/results.tgz" . 2>/dev/null; }

step "install"
last=$(ls -d .gpu-carry-* 2>/dev/null | sort -V | tail -1)
if [ ! -d "$SITE/onnxruntime" ] && [ -z "${SKIP_INSTALL:-}" ]; then  # SKIP_INSTALL: a dry run here
  [ -n "$last" ] && [ -f "$last/wheel.name" ] || { echo "the last carry folder (wheel.name) is not here"; exit 3; }
  want=$(cat "$last/parts.count")
  have=$(ls "$PARTS" | wc -l)
  [ "$have" -ge "$want" ] || { echo "only $have of $want parts in $PARTS: the machine was not kept warm"; exit 3; }
  wheel="/tmp/$(cat "$last/wheel.name")"
  cat "$PARTS"/ortgpu.part.* > "$wheel"
  echo "$(cat "$last/wheel.sha256")  $wheel" | sha256sum -c - || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$wheel" "$last"/wheels/*.whl || exit 3
fi
[ -n "$last" ] && [ -d "$last/models" ] && mkdir -p "$WORK/extra" && cp -n "$last"/models/*.onnx "$WORK/extra/"
export PYTHONPATH="$SITE:$root"
PY=$(python3 -c 'import sys; print(sys.executable)')
# tests/conftest.py runs the reprokit command next to the interpreter
if [ ! -x "$(dirname "$PY")/reprokit" ]; then
  printf '#!/bin/sh\nexec %s -m reprokit "$@"\n' "$PY" > "$(dirname "$PY")/reprokit"
  chmod +x "$(dirname "$PY")/reprokit"
fi

phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(info fidelity keep shrink explain fallback)
TARGETS=(ort:cuda ort:cuda,fp16 emulate:fp16 ort:cuda,bf16 emulate:bf16)

for phase in "${phases[@]}"; do
  case $phase in
  info)
    step "info"
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
    "$PY" -c 'import onnxruntime as o; print(o.__file__, o.__version__, o.get_available_providers())'
    "$PY" -m reprokit backends | tee "$WORK/backends.txt"
    "$PY" -m reprokit env --json > "$WORK/env.json"
    "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|onnx|onnxruntime|numpy|ml.dtypes|polygraphy|timm|torchvision|nvidia-cudnn|nvidia-cublas) ' \
      | tee "$WORK/versions.txt"
    pack
    ;;
  fidelity)
    step "models"
    [ -f "$WORK/models/manifest.json" ] || "$PY" bench/gpu_suite.py models --extra "$WORK/extra" --out "$WORK/models"
    step "fidelity (${TARGETS[*]}) and the gpu tests beside it"
    (timeout 330 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_ort_cuda.py > "$WORK/pytest-gpu.log" 2>&1
     echo "pytest exit $?" >> "$WORK/pytest-gpu.log") &
    tests=$!
    args=()
    for t in "${TARGETS[@]}"; do args+=(--target "$t"); done
    timeout 330 "$PY" bench/gpu_suite.py fidelity --manifest "$WORK/models/manifest.json" "${args[@]}" --jobs 6 \
      --matched --timeout 240 --out "$WORK"
    wait $tests
    tail -15 "$WORK/pytest-gpu.log"
    pack
    ;;
  shrink)
    # SHRINK_TARGET (default ort:cuda,fp16), SHRINK_ONLY="model …", SHRINK_OUT (default the work folder)
    target=${SHRINK_TARGET:-ort:cuda,fp16}
    out=${SHRINK_OUT:-$WORK}
    only=()
    for m in ${SHRINK_ONLY:-}; do only+=(--only "$m"); done
    step "shrink, verify, audit under $target ${SHRINK_ONLY:-}"
    mkdir -p "$out"
    timeout "${SHRINK_LIMIT:-360}" "$PY" bench/gpu_suite.py shrink --manifest "$WORK/models/manifest.json" --fidelity "$WORK/fidelity.json" \
      --target "$target" "${only[@]}" --max 6 --audit "${SHRINK_AUDIT:-2}" --jobs 4 --timeout 300 --out "$out"
    for f in "$out"/shrink-*/report.tar.gz; do [ -f "$f" ] && cp "$f" "$out/$(basename "$(dirname "$f")").tar.gz"; done
    pack
    ;;
  keep)
    step "fp32-nodes: the fault node alone and the catalog's keep_fp32, kernels and emulator"
    timeout 200 "$PY" bench/gpu_suite.py keep --target ort:cuda,fp16 --target emulate:fp16 --jobs 8 --out "$WORK"
    pack
    ;;
  explain)
    step "explain: layerwise where the emulator did not predict the kernels"
    timeout 120 "$PY" bench/gpu_suite.py explain --manifest "$WORK/models/manifest.json" --fidelity "$WORK/fidelity.json" \
      --jobs 8 --timeout 110 --out "$WORK"
    pack
    ;;
  fallback)
    step "CPU-fallback refusal: libraries hidden"
    bash scripts/gpu-hide-libs.sh "$PY" "$WORK" 2>&1 | tee "$WORK/fallback.log"
    pack
    ;;
  *) echo "unknown phase $phase" ;;
  esac
done
step "done"
pack
ls -la "$OUT"
