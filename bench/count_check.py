"""Run a check command and log the call: ``python bench/count_check.py LOG CMD...``.

Appends "<time> <model> <nodes> heavy=<n>" to LOG (the first argument of CMD ending in .onnx is
the model the tool under test wrote; n: its heavy layers, reprokit/shrink/buildcost.py's count
the estimate of TensorRT build seconds prices), then runs CMD and exits with its status, its output
passed through. Lets both tools' check calls and build work be counted the same way
(:func:`read_log`). With $BENCH_CAPTURE_DIR set,
the model is also copied there (callNNN.onnx, in call order) for bench/trt_buildcost_prepare.py:
both tools' pass/fail builds timed on a TensorRT builder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def read_log(path: str) -> list[tuple[int, int | None]]:
    """(nodes, heavy layers) per logged call, from count_check's or oracle_check's lines; heavy is
    None on a line written before the heavy count was logged."""
    calls = []
    with open(path) as handle:
        for line in handle:
            parts = line.split()
            if not parts:
                continue
            heavy = next((int(p[6:]) for p in parts if p.startswith("heavy=")), None)
            nodes = next((int(p) for p in reversed(parts) if p.isdigit()), 0)
            calls.append((nodes if len(parts) > 2 else 0, heavy))
    return calls


def model_work(path: str) -> tuple[int, int | None]:
    """(nodes, heavy layers) of the model file ``path`` — what one build of it makes, by the rule
    both tools' calls are counted with; heavy None with a reprokit that has no heavy count."""
    import onnx

    proto = onnx.load(path, load_external_data=False)
    try:
        from reprokit.shrink.buildcost import heavy_layers
    except ImportError:
        return len(proto.graph.node), None
    return len(proto.graph.node), heavy_layers(proto)


def main(argv: list[str]) -> int:
    log, cmd = argv[0], argv[1:]
    model = next((a for a in cmd if a.endswith(".onnx")), None)
    nodes, heavy = 0, "heavy=0"
    if model and os.path.exists(model):
        nodes, count = model_work(model)
        # a reprokit without the count logs none (read_log: None)
        heavy = "" if count is None else f"heavy={count}"
    with open(log, "a") as handle:
        handle.write(f"{time.time():.3f} {model} {nodes} {heavy}".rstrip() + "\n")
    capture = os.environ.get("BENCH_CAPTURE_DIR")
    if capture and model and os.path.exists(model):
        import shutil

        os.makedirs(capture, exist_ok=True)
        shutil.copyfile(model, os.path.join(capture, f"call{len(os.listdir(capture)):03d}.onnx"))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
