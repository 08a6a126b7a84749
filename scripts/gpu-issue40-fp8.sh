#!/usr/bin/env bash
# Issue 40 on the device (docs/quantized.md, "FP8"): ort:cuda on FP8 and int8 Q/DQ models, with
# this branch's reprokit. Prepare here, from the repo root: bash scripts/gpu-ort-prepare.sh; then
# .gpu-carry-0h40/ (git-ignored; "0" sorts it before the ORT parts, whose last folder the suite
# script finds by name) holding src/reprokit + src/templates (copies), this script as run.sh, and
# from samples/make_quantized.py --fp8: mobilenetv2.{qdq,fp8}.onnx, vit.fp8.onnx, both inputs.npz.
# Calls, right after each other: carry .gpu-carry-1 … -4, command "bash scripts/gpu-ort-suite.sh
# part"; then carry [.gpu-carry-5, .gpu-carry-0h40], command "bash .gpu-carry-0h40/run.sh".
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash scripts/gpu-ort-suite.sh run info > /tmp/h40-install.log 2>&1; echo "install rc=$?"; tail -5 /tmp/h40-install.log
exec > >(tee "$OUT/h40.log") 2>&1
export PYTHONUNBUFFERED=1
H=$(pwd)/.gpu-carry-0h40; cd $H/src
export PYTHONPATH=/tmp/ortgpu-site:$H/src
python3 -c 'import onnxruntime as o, reprokit; print(o.__version__, o.get_available_providers(), reprokit.__file__)'
W=/tmp/h40w; rm -rf $W; mkdir -p $W
step() { echo; echo "=== $(date +%T) [$SECONDS s] $*"; }
for m in vit mobilenetv2; do
  step "check $m.fp8 ort:cuda"; python3 -m reprokit check $H/$m.fp8.onnx --inputs $H/$m.inputs.npz --target ort:cuda; echo "rc=$?"
done
step "check mobilenetv2.qdq ort:cuda"; python3 -m reprokit check $H/mobilenetv2.qdq.onnx --inputs $H/mobilenetv2.inputs.npz --target ort:cuda; echo "rc=$?"
step "shrink mobilenetv2.qdq ort:cuda"; timeout 300 python3 -m reprokit shrink $H/mobilenetv2.qdq.onnx --inputs $H/mobilenetv2.inputs.npz --target ort:cuda -o $W/mshr; echo "rc=$?"
[ -f $W/mshr/report.tar.gz ] && { step "verify"; python3 -m reprokit verify $W/mshr/report.tar.gz; echo "rc=$?"; tar -xzOf $W/mshr/report.tar.gz logs/repro.log 2>/dev/null | tail -15; }
step "shrink vit.fp8 ort:cuda"; timeout 200 python3 -m reprokit shrink $H/vit.fp8.onnx --inputs $H/vit.inputs.npz --target ort:cuda -o $W/vshr; echo "rc=$?"
[ -f $W/vshr/report.tar.gz ] && { step "verify vit.fp8"; python3 -m reprokit verify $W/vshr/report.tar.gz; echo "rc=$?"; }
for d in mshr vshr; do [ -f $W/$d/summary.json ] && cp $W/$d/summary.json $OUT/$d.summary.json; done
step done
