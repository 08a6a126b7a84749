#!/usr/bin/env bash
# The trt engine against a real TensorRT-RTX, on the GPU machine (H100, Python 3.12, no network).
# Prepare here first: bash scripts/gpu-prepare.sh; then call the device tool twice in a row,
#   1) carry [".gpu-carry-a"], command: "true"            (the first half travels)
#   2) carry [".gpu-carry-b"], command: "bash scripts/gpu-smoke.sh"
# It installs the wheels into .gpu-site, then:
#   - checks every sample with --target trt and trt:fp16 (expected: parse and build succeed; the
#     run is refused on compute capability 9.0 → exit 4 with TensorRT's own reason),
#   - probes which ONNX constructs TensorRT-RTX refuses to parse or build,
#   - shrinks a 100+ node model holding the first refused construct (build-error signature),
#     with its report archive.
# Everything lands in $OUT (the device tool brings it back): smoke.log, probe.tsv, samples.tsv,
# shrink_summary.json, report.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/smoke.log") 2>&1
export PYTHONUNBUFFERED=1 POLYGRAPHY_USE_TENSORRT_RTX=1
PY=${PY:-python3}
root=$(pwd)
step() { echo; echo "=== $(date +%T) $*"; }

step "install"
if [ -z "${SKIP_INSTALL:-}" ] && [ ! -d .gpu-site/tensorrt_rtx_libs ]; then
  libs="/tmp/$(cat .gpu-carry-a/libs.name)"
  cat .gpu-carry-a/libs.part.* .gpu-carry-b/libs.part.* > "$libs"
  echo "$(cat .gpu-carry-a/libs.sha256)  $libs" | sha256sum -c - || exit 1
  $PY -m pip install -q --no-index --no-deps --no-compile --target .gpu-site "$libs" .gpu-carry-a/*.whl || exit 1
fi
export PYTHONPATH="$root/.gpu-site:$root"
cudart=$($PY - <<'PY'
import glob, os, site
dirs = set()
for base in site.getsitepackages():
    for lib in glob.glob(os.path.join(base, "nvidia", "**", "libcudart.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="${cudart}:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
$PY -m reprokit backends
$PY -m reprokit env --json > "$OUT/env.json"

work=$(mktemp -d)
step "samples: reprokit check --target trt / trt:fp16"
printf 'sample\ttarget\texit\tseconds\tmessage\n' > "$OUT/samples.tsv"
for model in samples/*.onnx; do
  name=$(basename "$model" .onnx)
  for target in trt trt:fp16; do
    SECONDS=0
    $PY -m reprokit check "$model" --target "$target" --inputs "samples/$name.inputs.npz" --timeout 300 > "$work/check.txt" 2>&1
    code=$?
    msg=$(grep -E "^(Error|Hint|DIVERGES|AGREES)" "$work/check.txt" | tr '\n' ' ')
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$target" "$code" "$SECONDS" "$msg" | tee -a "$OUT/samples.tsv"
  done
done

step "probe: which constructs does TensorRT-RTX refuse? (built for compute capability 8.9)"
$PY - "$work/tiny.onnx" <<'PY'
import sys, numpy as np, onnx
from onnx import helper, numpy_helper
# x[1,4,8,8] -> Conv -> Relu -> Conv -> y
w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", 1, [1, 4, 8, 8])],
                      [helper.make_tensor_value_info("y", 1, [1, 4, 8, 8])], [w])
onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
printf 'construct\texit\tmessage\n' > "$OUT/probe.tsv"
refused=""
for c in Unique Det DFT STFT MaxUnpool BitShift ConcatFromSequence Bernoulli; do
  $PY scripts/splice_construct.py "$work/tiny.onnx" "$c" "$work/tiny_$c.onnx" >/dev/null || continue
  $PY -m reprokit check "$work/tiny_$c.onnx" --target trt:compute-capability=8.9 --timeout 300 > "$work/check.txt" 2>&1
  code=$?
  msg=$(grep -E "^(Error|DIVERGES|AGREES)|engine message" "$work/check.txt" | tr '\n' ' ')
  printf '%s\t%s\t%s\n' "$c" "$code" "$msg" | tee -a "$OUT/probe.tsv"
  if [ "$code" = 1 ] && [ -z "$refused" ]; then refused=$c; fi
done
$PY -m reprokit check "$work/tiny.onnx" --target trt 2>&1 | tail -3
$PY -m reprokit check "$work/tiny.onnx" --target trt:compute-capability=8.9 2>&1 | tail -3

if [ -n "$refused" ]; then
  step "shrink: samples/layernorm_overflow.onnx + $refused, --target trt:compute-capability=8.9"
  $PY scripts/splice_construct.py samples/layernorm_overflow.onnx "$refused" "$work/refused.onnx"
  start=$(date +%s)
  $PY -m reprokit shrink "$work/refused.onnx" --target trt:compute-capability=8.9 -o "$work/shrink" --timeout 300
  echo "shrink exit code $? after $(( $(date +%s) - start )) s"
  $PY - "$work/shrink/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
c = s["calls"]
print("signature:", s["signature"]["kind"], s["signature"]["detail"])
print("nodes:", s["original"]["nodes"], "->", s["minimal"]["nodes"], s["minimal"]["ops"], "one_minimal:", s["one_minimal"])
print("target calls:", c["target"], "cached:", c["cached"], "builds timed:", len(c["build_seconds"]),
      "build seconds:", c["build_seconds"], "mean s/call:", c["seconds_per_target_call"])
for step in s["steps"]:
    print("  step", step)
PY
  ls -la "$work/shrink/.reprokit/timing.cache" 2>&1
  cp "$work/shrink/summary.json" "$OUT/shrink_summary.json" 2>/dev/null
  cp "$work/shrink/report.tar.gz" "$OUT/report.tar.gz" 2>/dev/null
  $PY -m reprokit verify "$work/shrink/report.tar.gz"; echo "verify exit code $?"
else
  echo "no construct was refused: nothing to shrink"
fi
step "done"
