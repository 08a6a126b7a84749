"""What a shrink run's process does after summary.json's last write: its wall (as the caller sees
it) minus summary.json's ``wall_s``, run after run (issue 39; a table, not a test).

    python bench/exit_tail.py --runs 5 --hog --baseline ba9416b

The run is tests/test_progress.py's (``x[1,16] -> MatMul(3e4) -> y`` under ``emulate:fp16``, the
archive packed), whose bound this tail once broke in CI (4.30 vs 4.62 s). ``--hog`` keeps one
busy-looping process beside the runs (a loaded machine); ``--baseline REV`` alternates with
reprokit as of that revision (bench_overhead.export: exported and compiled alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from bench_overhead import export  # noqa: E402
from bench_passfail import REPROKIT, compile_bytecode  # noqa: E402


def one_run(folder: str, pythonpath: str | None) -> tuple[float, float]:
    """(the process's wall, summary.json's wall_s) of one shrink run in ``folder``."""
    import numpy as np
    from models import matmul_overflow, save

    model = save(matmul_overflow(), os.path.join(folder, "m.onnx"))
    x = np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32)
    np.savez(os.path.join(folder, "in.npz"), x=x)
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [REPROKIT, "shrink", model, "--target", "emulate:fp16", "--inputs", "in.npz", "-o", "out"]
    started = time.monotonic()
    subprocess.run(cmd, cwd=folder, capture_output=True, env=env, timeout=900, check=True)
    wall = time.monotonic() - started
    with open(os.path.join(folder, "out", "summary.json")) as handle:
        return wall, json.load(handle)["wall_s"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--hog", action="store_true", help="one busy-looping process beside the runs"
    )
    parser.add_argument(
        "--baseline", metavar="REV", help="alternate with reprokit as of this git revision"
    )
    args = parser.parse_args(argv)
    compile_bytecode()
    root = tempfile.mkdtemp(prefix="bench-exit-tail-")
    trees = {"this tree": None}
    if args.baseline:
        trees[args.baseline] = export(args.baseline, os.path.join(root, "baseline"))
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.hog else None
    lines = [
        "| run | tree | process wall s | summary.json wall_s | after the last write s (share) |",
        "|---|---|---|---|---|",
    ]
    try:
        for number in range(args.runs):
            for name, path in trees.items():
                folder = tempfile.mkdtemp(dir=root)
                wall, summary = one_run(folder, path)
                lines.append(
                    f"| {number + 1} | {name} | {wall:.2f} | {summary:.2f} | "
                    f"{wall - summary:.2f} ({(wall - summary) / wall:.1%}) |"
                )
                print(lines[-1], file=sys.stderr, flush=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
