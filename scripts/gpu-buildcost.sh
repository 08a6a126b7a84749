#!/usr/bin/env bash
# TensorRT-RTX build-cost measurement on the GPU machine (bench/trt_buildcost.py), three device
# calls right after each other (one transfer carries at most 64 MiB; a warm machine keeps /tmp):
#   here:  bash scripts/gpu-buildcost-prepare.sh (the ONNX files, the wheel, three carry folders)
#   1) carry [".gpu-carry-h39a"], command "bash .gpu-carry-h39a/gpu-buildcost.sh stage"
#   2) carry [".gpu-carry-h39b"], command "bash .gpu-carry-h39b/gpu-buildcost.sh stage"
#   3) carry [".gpu-carry-h39c"], command "bash .gpu-carry-h39c/gpu-buildcost.sh run"
# Each carry folder holds this script, bench/trt_buildcost.py, parts of the TensorRT-RTX libs wheel
# (split -b 48M) and of the cases archives (casesX.tar.xz split into casesX.part.*). The carry
# folders are git-ignored (.gpu-carry*/): copy them into the checkout the device tool sends.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
stage=/tmp/h39
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$stage" "$OUT"
cp "$here"/* "$stage"/
ls -la "$stage"
[ "${1:-}" = run ] || exit 0
exec > >(tee "$OUT/buildcost.log") 2>&1
export PYTHONUNBUFFERED=1
cd "$stage"
name=$(cut -d' ' -f3 libs.sha256)
cat libs.part.* > "$name"
sha256sum -c libs.sha256 || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$stage/site" "$name" tensorrt_rtx_cu13_bindings-*.whl || exit 1
for prefix in $(ls cases*.part.* | sed 's/\.part\..*//' | sort -u); do
  cat "$prefix".part.* | xz -d | tar -x -C "$stage" || exit 1
done
export PYTHONPATH="$stage/site"
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
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm --format=csv,noheader
python3 -c "import onnx, sys; print('python', sys.version.split()[0], 'onnx', onnx.__version__)"
nproc
python3 "$stage/trt_buildcost.py" "$stage/h39cases" "$OUT/buildcost.jsonl" --deadline-s "${DEADLINE:-480}" --order "${ORDER:-whole,single,run,polygraphy,subpack}"
echo "exit $?"
