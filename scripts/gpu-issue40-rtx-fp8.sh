#!/usr/bin/env bash
# h40 on the device: FP8 Q/DQ models built by TensorRT-RTX 1.7.1.116 (strongly typed, for compute
# capability 8.9: the RTX runtime refuses the H100's 9.0). Call A: carry .gpu-carry-h36a-1,
# command "bash -c 'mkdir -p /tmp/rtxparts && cp .gpu-carry-h36a-1/* /tmp/rtxparts/'";
# call B (warm): carry .gpu-carry-h36a-2 .gpu-carry-h36a .gpu-carry-0h40, this script.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/h40-rtx-fp8.log") 2>&1
export PYTHONUNBUFFERED=1
C=$(pwd)/.gpu-carry-h36a; H=$(pwd)/.gpu-carry-0h40; site=/tmp/h36a-site
name=$(cut -d' ' -f3 /tmp/rtxparts/libs.sha256)
cat /tmp/rtxparts/libs.part.* .gpu-carry-h36a-2/libs.part.* > "/tmp/$name"
(cd /tmp && sha256sum -c /tmp/rtxparts/libs.sha256) || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "/tmp/$name" /tmp/rtxparts/*.whl "$C"/wheels/*.whl || exit 1
cp -r "$C/rtxwrap/tensorrt_rtx" "$site/"
export PYTHONPATH="$site:$H/src" PATH="$site/bin:$PATH"
cudart=$(python3 -c 'import glob,os,site; print(":".join(sorted({os.path.dirname(l) for b in site.getsitepackages() for l in glob.glob(os.path.join(b,"nvidia","**","libcudart.so*"),recursive=True)})))')
export LD_LIBRARY_PATH="${cudart}:${LD_LIBRARY_PATH:-}"
export POLYGRAPHY_USE_TENSORRT_RTX=1
cd "$H/src"
python3 - "$H" <<'PY'
import json, sys, time
from reprokit.engine.backends.trt import TrtBackend
from reprokit.spec import parse_target
from reprokit.standalone.arrays import load_npz
H = sys.argv[1]
for m in ("vit", "mobilenetv2"):
    feeds = load_npz(f"{H}/{m}.inputs.npz")
    for text in ("trt:fp8,compute-capability=8.9",):
        backend = TrtBackend(parse_target(text))
        backend.build_only = True
        t = time.time()
        try:
            result = backend.run(f"{H}/{m}.fp8.onnx", feeds, None)
            print(m, "fp8", text, "BUILT in", round(time.time() - t, 2), "s; meta:", json.dumps({k: v for k, v in result.meta.items() if k != "fp32_layers"}, default=str)[:600])
        except Exception as exc:
            print(m, "fp8", text, "FAILED:", type(exc).__name__, str(exc)[:400])
PY
python3 -m reprokit check $H/vit.fp8.onnx --inputs $H/vit.inputs.npz --target trt:fp8,compute-capability=8.9; echo "check vit.fp8 trt:fp8 rc=$?"
python3 -m reprokit check $H/vit.fp8.onnx --inputs $H/vit.inputs.npz --target trt:int8,compute-capability=8.9; echo "check vit.fp8 trt:int8 rc=$?"
python3 -m reprokit check $H/mobilenetv2.qdq.onnx --inputs $H/mobilenetv2.inputs.npz --target trt:fp8,compute-capability=8.9; echo "check mobilenetv2.qdq (int8) trt:fp8 rc=$?"
