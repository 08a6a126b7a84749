#!/usr/bin/env bash
# For every sample: shrink it (reprokit from the project's venv), then run the archive's repro.py
# in a FRESH virtual environment holding only numpy, onnx and onnxruntime (+ openvino for the
# OpenVINO case): it must exit 1 and print reprokit's numbers; with a target setting that does
# not diverge it must exit 0. Prints a Markdown table.   bash bench/repro_in_fresh_venv.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q numpy onnx onnxruntime openvino
(cd "$work" && "$work/venv/bin/python" -c "import importlib.util as u; assert u.find_spec('reprokit') is None; print('fresh venv without reprokit:', __import__('onnxruntime').__version__)")
reprokit=${REPROKIT:-reprokit}
row() {  # name model target alt [extra args]
  local name=$1 model=$2 target=$3 alt=$4; shift 4
  "$reprokit" shrink "$model" --target "$target" -o "$work/$name" "$@" >/dev/null 2>&1
  local ours
  ours=$(python3 - "$work/$name/summary.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))["verdict"]
print("; ".join(f"{o['name'][-28:]} rel L2 {float(o['rel_l2']):.4g} NaN {o['target_nan']} Inf {o['target_inf']}" for o in v["outputs"]))
PY
)
  mkdir -p "$work/$name/x" && tar xzf "$work/$name/report.tar.gz" -C "$work/$name/x"
  local dir=$work/$name/x/report code alt_code line
  set +e
  (cd "$dir" && "$work/venv/bin/python" repro.py > ../repro.out 2>&1); code=$?
  (cd "$dir" && "$work/venv/bin/python" repro.py --target "$alt" > ../alt.out 2>&1); alt_code=$?
  set -e
  line=$(grep -E "^\S" "$work/$name/x/repro.out" | sed -n '4p' | tr -s ' ')
  printf '| %s | `%s` | %s | %s | `%s` | %s | %s |\n' "$name" "$target" "$ours" "$code" "$line" "$alt" "$alt_code"
}
echo "| sample | target | reprokit's numbers (minimal model) | repro.py exit | repro.py's line | other setting | its exit |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for name in attention_softmax_nan layernorm_overflow log_div_underflow conv_clip static_batch_broadcast; do
  row "$name" "$root/samples/$name.onnx" emulate:fp16 ort --inputs "$root/samples/$name.inputs.npz"
done
det=$(python3 -c "import rapidocr_onnxruntime, os; print(os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), 'models', 'ch_PP-OCRv4_det_infer.onnx'))" 2>/dev/null || true)
if [ -n "$det" ] && [ -f "$det" ]; then
  row pp_ocr_det "$det" openvino:bf16 openvino:f32 --input-shapes x:1x3x320x320
fi
rm -rf "$work"
