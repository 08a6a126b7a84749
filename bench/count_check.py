"""Run a check command and log the call: ``python bench/count_check.py LOG CMD...``.

Appends "<time> <model> <nodes>" to LOG (the first argument of CMD ending in .onnx is the model
the tool under test wrote), then runs CMD and exits with its status, its output passed through.
Lets both tools' check calls and build work be counted the same way. With $BENCH_CAPTURE_DIR set,
the model is also copied there (callNNN.onnx, in call order) for bench/trt_buildcost_prepare.py:
both tools' pass/fail builds timed on a TensorRT builder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    log, cmd = argv[0], argv[1:]
    model = next((a for a in cmd if a.endswith(".onnx")), None)
    nodes = 0
    if model and os.path.exists(model):
        import onnx

        nodes = len(onnx.load(model, load_external_data=False).graph.node)
    with open(log, "a") as handle:
        handle.write(f"{time.time():.3f} {model} {nodes}\n")
    capture = os.environ.get("BENCH_CAPTURE_DIR")
    if capture and model and os.path.exists(model):
        import shutil

        os.makedirs(capture, exist_ok=True)
        shutil.copyfile(model, os.path.join(capture, f"call{len(os.listdir(capture)):03d}.onnx"))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
