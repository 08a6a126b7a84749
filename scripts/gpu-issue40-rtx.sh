#!/usr/bin/env bash
# Issue 40 on the GPU machine: trt:int8 on the Q/DQ models (explicit quantization, strongly typed)
# with TensorRT-RTX 1.7.1.116: does the builder take them, in what time; then the CLI up to the
# runtime's sm_90 refusal. Install as .gpu-carry-h36a/run.sh does (scripts/gpu-issue36.sh).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/h40-rtx.log") 2>&1
export PYTHONUNBUFFERED=1
C=$(pwd)/.gpu-carry-h36a
site=/tmp/h36a-site
name=$(cut -d' ' -f3 .gpu-carry-h36a-1/libs.sha256)
cat .gpu-carry-h36a-1/libs.part.* .gpu-carry-h36a-2/libs.part.* > "/tmp/$name"
(cd /tmp && sha256sum -c "$OLDPWD/.gpu-carry-h36a-1/libs.sha256") || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "/tmp/$name" .gpu-carry-h36a-1/*.whl "$C"/wheels/*.whl || exit 1
cp -r "$C/rtxwrap/tensorrt_rtx" "$site/"
export PYTHONPATH="$site:$(pwd)" PATH="$site/bin:$PATH"
cudart=$(python3 -c 'import glob,os,site; print(":".join(sorted({os.path.dirname(l) for b in site.getsitepackages() for l in glob.glob(os.path.join(b,"nvidia","**","libcudart.so*"),recursive=True)})))')
export LD_LIBRARY_PATH="${cudart}:${LD_LIBRARY_PATH:-}"
export POLYGRAPHY_USE_TENSORRT_RTX=1
D=.gpu-carry-h40
python3 - <<'PY'
import json, time
from reprokit.engine.backends.trt import TrtBackend
from reprokit.spec import parse_target
from reprokit.standalone.arrays import load_npz
D = ".gpu-carry-h40"
for m, kind in [(m, k) for k in ("trtq", "qdq") for m in ("vit", "mobilenetv2", "ppocr_det")]:
    feeds = load_npz(f"{D}/{m}.inputs.npz")
    for text in ("trt:int8,compute-capability=8.9",):
        backend = TrtBackend(parse_target(text))
        backend.build_only = True
        t = time.time()
        try:
            result = backend.run(f"{D}/{m}.{kind}.onnx", feeds, None)
            print(m, kind, text, "BUILT in", round(time.time() - t, 2), "s; meta:", json.dumps({k: v for k, v in result.meta.items() if k != "fp32_layers"}, default=str)[:600])
        except Exception as exc:
            print(m, kind, text, "FAILED:", type(exc).__name__, str(exc)[:300])
PY
for m in vit mobilenetv2; do
  python3 -m reprokit check $D/$m.trtq.onnx --inputs $D/$m.inputs.npz --target trt:int8,compute-capability=8.9; echo "check $m trt:int8 rc=$?"
done
python3 -m reprokit check samples/attention_softmax_nan.onnx --target trt:int8,compute-capability=8.9; echo "check (no Q/DQ) trt:int8 rc=$?"
