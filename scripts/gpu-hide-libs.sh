#!/usr/bin/env bash
# The CPU-fallback refusal on the device (docs/gpu.md): hide cuBLAS, then cuDNN, from the whole
# machine (every copy is moved aside and put back after), and show what plain onnxruntime does
# and what reprokit answers (expected: exit 4 naming the library, never a verdict).
# Usage (from scripts/gpu-ort-suite.sh): bash scripts/gpu-hide-libs.sh PYTHON WORKDIR
set -uo pipefail
PY=$1
WORK=$2
model=samples/conv_clip.onnx
feeds=samples/conv_clip.inputs.npz
hidden=/tmp/hidden-libs
probe() {  # plain onnxruntime: which providers the session got, and what a run does
  "$PY" - "$model" "$feeds" <<'PY'
import sys, numpy as np, onnxruntime as ort
feeds = dict(np.load(sys.argv[2]))
try:
    s = ort.InferenceSession(sys.argv[1], providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    print("  plain onnxruntime: session providers", s.get_providers())
    s.run(None, feeds)
    print("  plain onnxruntime: the run succeeded (on", s.get_providers()[0] + ")")
except Exception as exc:
    print("  plain onnxruntime:", type(exc).__name__, str(exc).strip().splitlines()[0][:300])
PY
}
echo "where the libraries are loaded from (a CUDA session running $model):"
"$PY" - "$model" "$feeds" <<'PY'
import sys, numpy as np
from reprokit.engine.backends.ort_cuda import cuda_library_error
print("  cuda_library_error():", cuda_library_error())
import onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
s.run(None, dict(np.load(sys.argv[2])))
seen = sorted({line.split()[-1] for line in open("/proc/self/maps") if any(k in line for k in ("libcudnn", "libcublas", "libcudart"))})
print("\n".join("  " + p for p in seen))
PY
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
for group in cublas cudnn; do
  echo
  echo "--- hiding every lib${group}*.so* on the machine"
  mkdir -p "$hidden/$group"
  : > "$hidden/$group.list"
  while IFS= read -r -d '' lib; do
    target="$hidden/$group$(dirname "$lib")"
    mkdir -p "$target" && mv "$lib" "$target/" && echo "$lib" >> "$hidden/$group.list"
  done < <(find /usr /opt /lib /lib64 /tmp/ortgpu-site -xdev \( -type f -o -type l \) -name "lib${group}*.so*" -print0 2>/dev/null)
  echo "  hidden: $(wc -l < "$hidden/$group.list") files"
  probe
  "$PY" -m reprokit backends 2>&1 | grep -E "^ *ort|cuda" | head -3
  for target in ort:cuda,fp16 ort:cuda; do
    "$PY" -m reprokit check "$model" --target "$target" --inputs "$feeds" > "$WORK/hide-$group.txt" 2>&1
    code=$?
    echo "  reprokit check --target $target → exit $code"
    grep -E "^(Error|Hint|DIVERGES|AGREES)" "$WORK/hide-$group.txt" | sed 's/^/    /'
  done
  while IFS= read -r lib; do
    mv "$hidden/$group$(dirname "$lib")/$(basename "$lib")" "$lib" || echo "  could not put back $lib"
  done < "$hidden/$group.list"
  echo "  put back"
done
echo
echo "--- after putting them back"
probe
"$PY" -m reprokit check "$model" --target ort:cuda,fp16 --inputs "$feeds" > /dev/null 2>&1
echo "  reprokit check --target ort:cuda,fp16 → exit $?"
