"""Time `reprokit verify --versions 'onnxruntime>=1.24' --bisect` on the real regression of
samples/matrix/make_cse_string_attr.py (microsoft/onnxruntime#28413), three ways:

  cold   a fresh uv cache and a fresh environment cache (every wheel downloaded)
  wheels uv's wheel cache warm, a fresh environment cache (every environment built)
  warm   both warm (every environment reused)

The archive is packed first as a user on onnxruntime 1.26.0 would: reprokit run in a uv
environment holding that release. Writes bench/results/matrix.{json,md}.

    python bench/matrix_bisect.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "samples", "matrix"))

import make_cse_string_attr  # noqa: E402

from reprokit.matrix.envs import EnvRequest, ensure_env  # noqa: E402

SPEC = "onnxruntime>=1.24"
PACK = ("onnxruntime==1.26.0", "numpy", "onnx", "onnx-graphsurgeon", "polygraphy", "click", "rich", "jinja2",
        "ml-dtypes", "packaging")


def main() -> None:
    work = tempfile.mkdtemp(prefix="reprokit-bench-matrix-")
    base = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    os.environ["REPROKIT_ENV_CACHE"] = os.path.join(work, "pack-env")
    packer = ensure_env(EnvRequest(PACK))
    model, inputs = make_cse_string_attr.write(work)
    archive = os.path.join(work, "cse.tar.gz")
    subprocess.run([packer.python, "-m", "reprokit", "pack", model, "--inputs", inputs, "--target", "ort:opt",
                    "-o", archive], env=base, check=True, capture_output=True)
    uv_cache = os.path.join(work, "uv-cache")
    runs = []
    for name, envs in (("cold", "envs-1"), ("wheels", "envs-2"), ("warm", "envs-2")):
        env = {**base, "UV_CACHE_DIR": uv_cache, "REPROKIT_ENV_CACHE": os.path.join(work, envs)}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "reprokit", "verify", archive, "--versions", SPEC, "--bisect",
                               "--json", "-o", os.path.join(work, f"{name}.matrix.tar.gz")], env=env,
                              capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
        payload = json.loads(done.stdout)
        found = payload["bisect"]
        runs.append({"run": name, "wall_s": round(wall, 1), "releases": len(found["versions"]),
                     "environments": found["environments"],
                     "boundaries": [f"{b['kind']} {b['before']} -> {b['after']}" for b in found["boundaries"]],
                     "env_s": sum(r["env_seconds"] or 0 for r in payload["rows"]),
                     "repro_s": sum(r["run_seconds"] or 0 for r in payload["rows"])})
        print(runs[-1], file=sys.stderr)
    out = os.path.join(ROOT, "bench", "results")
    with open(os.path.join(out, "matrix.json"), "w") as handle:
        json.dump({"spec": SPEC, "cpu_count": os.cpu_count(), "runs": runs}, handle, indent=2)
    lines = [f"# verify --versions '{SPEC}' --bisect (bench/matrix_bisect.py)", "",
             "| run | wall (s) | releases | environments | env build (s, sum) | repro.py (s, sum) | found |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['run']} | {r['wall_s']} | {r['releases']} | {r['environments']} | {r['env_s']:.1f} | "
              f"{r['repro_s']:.1f} | {'; '.join(r['boundaries'])} |" for r in runs]
    with open(os.path.join(out, "matrix.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
