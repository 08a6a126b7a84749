#!/usr/bin/env bash
# Issue 36 on the GPU machine (docs/gpu.md, "Issue 36"): TensorRT-RTX 1.7.1.116. Prepare in the
# repository root (git-ignored folders, one transfer carries at most 64 MiB):
#   .gpu-carry-h36a-1/  first half of tensorrt_rtx_cu13_libs (split -b 48M), libs.sha256, the bindings wheel
#   .gpu-carry-h36a-2/  second half of the libs wheel
#   .gpu-carry-h36a/    wheels/ (polygraphy 0.53.6, onnx-graphsurgeon), rtxwrap/tensorrt_rtx (from the
#                       tensorrt-rtx-cu13 sdist: the module polygraphy imports), src/ (reprokit, templates),
#                       this script as run.sh
# then two device calls right after each other: carry [".gpu-carry-h36a-1"], command "true"; then
# carry [".gpu-carry-h36a-2", ".gpu-carry-h36a"], command "bash .gpu-carry-h36a/run.sh".
# 1) the strongly typed path with fp32-nodes kept (build for compute capability 8.9: H100 is 9.0,
#    which the RTX runtime refuses), 2) the printed polygraphy command of an emulate archive with
#    POLYGRAPHY_USE_TENSORRT_RTX=1 up to the refusal, 3) repro.py --target trt:fp16 there.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/h36a.log") 2>&1
export PYTHONUNBUFFERED=1
C=$(pwd)/.gpu-carry-h36a
site=/tmp/h36a-site
step() { echo; echo "=== $(date +%T) $*"; }
step install
name=$(cut -d' ' -f3 .gpu-carry-h36a-1/libs.sha256)
cat .gpu-carry-h36a-1/libs.part.* .gpu-carry-h36a-2/libs.part.* > "/tmp/$name"
(cd /tmp && sha256sum -c "$OLDPWD/.gpu-carry-h36a-1/libs.sha256") || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "/tmp/$name" .gpu-carry-h36a-1/*.whl "$C"/wheels/*.whl || exit 1
cp -r "$C/rtxwrap/tensorrt_rtx" "$site/"  # pip install tensorrt-rtx-cu13: the module polygraphy imports
export PYTHONPATH="$site:$C/src" PATH="$site/bin:$PATH"
cudart=$(python3 - <<'PY'
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
export POLYGRAPHY_USE_TENSORRT_RTX=1
python3 -m reprokit backends 2>&1 | grep -i -E "trt|tensorrt"
KEPT=layer0/self0/attn/softmax
if [ -z "${ROUND2:-}" ]; then
step "1. strongly typed build, fp32-nodes kept (trt:fp16,fp32-nodes=$KEPT,compute-capability=8.9)"
python3 - "$KEPT" <<'PY'
import json, sys, time
import numpy as np, onnx
from reprokit.engine.backends.trt import TrtBackend
from reprokit.spec import parse_target
from reprokit.standalone.arrays import load_npz
kept = sys.argv[1]
model = "samples/attention_softmax_nan.onnx"
feeds = load_npz("samples/attention_softmax_nan.inputs.npz")
for text in (f"trt:fp16,fp32-nodes={kept},compute-capability=8.9", "trt:fp16,compute-capability=8.9"):
    backend = TrtBackend(parse_target(text))
    backend.build_only = True
    t = time.time()
    try:
        result = backend.run(model, feeds, None)
        print(text, "BUILT in", round(time.time() - t, 1), "s; meta:", json.dumps({k: v for k, v in result.meta.items() if k != "fp32_layers"}, default=str))
    except Exception as exc:
        print(text, "FAILED:", type(exc).__name__, str(exc)[:800])
PY
step "1a. TensorRT's layer names for the kept node (what --layer-precisions NAME must match)"
python3 - "$KEPT" <<'PY'
import sys
try:
    import tensorrt_rtx as trt
except ImportError:
    import tensorrt_rtx_bindings as trt
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = builder.create_network(0)
parser = trt.OnnxParser(network, logger)
ok = parser.parse_from_file("samples/attention_softmax_nan.onnx")
print("parsed", ok, "layers", network.num_layers)
kept = sys.argv[1]
for i in range(network.num_layers):
    layer = network.get_layer(i)
    if kept in layer.name or kept in (getattr(layer, "metadata", "") or ""):
        print(repr(layer.name), layer.type, repr(getattr(layer, "metadata", "")))
PY
fi
step "1b. the same through the CLI on this GPU (sm_90): exit 4 expected, TensorRT-RTX's reason"
python3 -m reprokit check samples/attention_softmax_nan.onnx --target "trt:fp16,fp32-nodes=$KEPT" --inputs samples/attention_softmax_nan.inputs.npz --timeout 300; echo "[exit $?]"
step "2. pack an emulate archive (CPU), run its printed RTX polygraphy line"
w=$(mktemp -d); cd "$w"
POLYGRAPHY_USE_TENSORRT_RTX=0 python3 -m reprokit pack "$OLDPWD/samples/attention_softmax_nan.onnx" --target "emulate:fp16,fp32-nodes=$KEPT" -o a.tar.gz; echo "[pack exit $?]"
tar xzf a.tar.gz && cd a
cp commands.sh ISSUE.md "$OUT/" 2>/dev/null
grep -n "polygraphy run\|trtexec" commands.sh
line=$(grep "^POLYGRAPHY_USE_TENSORRT_RTX=1 polygraphy run" commands.sh)
echo "\$ $line"; timeout 400 bash -c "$line"; echo "[exit $?]"
weak=$(grep "^polygraphy run model.onnx" commands.sh)
echo "\$ POLYGRAPHY_USE_TENSORRT_RTX=1 $weak   # the weakly typed form: RTX has no precision flags"
timeout 200 bash -c "POLYGRAPHY_USE_TENSORRT_RTX=1 $weak" 2>&1 | tail -5; echo "[exit $?]"
step "3. repro.py --target trt:fp16 with TensorRT-RTX"
timeout 400 python3 repro.py --target trt:fp16; echo "[exit $?]"
