"""The oracle both tools are judged by: run one candidate model on a target, compare with ORT fp32.

    python bench/oracle_check.py MODEL LAYERWISE_GOLDEN LAYERWISE_INPUTS --target T [--tol X]

Used as polygraphy's ``debug reduce --check`` command (MODEL is the candidate it writes, e.g.
``polygraphy_debug.onnx``) and by ``bench_shrink.py`` to judge both tools' final models.

* Graph inputs of MODEL are taken by exact name from LAYERWISE_INPUTS (polygraphy JSON from
  ``polygraphy data merge``, or an ``.npz``).
* The target runs in-process through reprokit's own backend classes
  (``create_backend(parse_target(T)).run(path, feeds, None)``).
* Reference values for MODEL's outputs are taken by exact name from LAYERWISE_GOLDEN (polygraphy
  ``--save-outputs`` JSON of ``--onnxrt --onnx-outputs mark all``, or an ``.npz``): ORT fp32,
  captured once.
* The comparison is reprokit's: ``Criterion.for_precision(backend.precision(), "rel-l2", tol)``,
  ``compare_arrays`` per output, and ``Oracle.verdict_from`` for the verdict kind (nonfinite in the
  target only → nonfinite; any output over the bound → mismatch; otherwise agree).

Prints ``DIVERGES nonfinite`` / ``DIVERGES mismatch`` / ``AGREES`` and exits 1 when the model
diverges, 0 when not. Other outcomes print a line that matches neither and exit with 2 (usage or
missing data), 3 (the target refused the model) or 5 (the reference itself is not finite).
Every invocation appends one line to the file named by $BENCH_CALL_LOG, if set, and copies the
model it was given into the folder $BENCH_CAPTURE_DIR, if set (callNNN.onnx, for
bench/trt_buildcost_prepare.py: polygraphy's builds timed on a TensorRT builder).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def load_tensors(path: str) -> dict:
    """name → array from a polygraphy JSON (inputs, merged inputs or RunResults) or an .npz."""
    import numpy as np

    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as data:
            return {k: np.array(data[k]) for k in data.files}
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    data = load_json(path)
    if isinstance(data, RunResults):
        if len(data) != 1:
            raise SystemExit(f"ERROR {path}: expected outputs of exactly one runner, got {len(data)}")
        _, iterations = data[0]
        return dict(iterations[0].items())
    if isinstance(data, list):  # list of feed dicts, one per iteration: the first, like polygraphy
        return dict(data[0].items())
    return dict(data.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("golden")
    parser.add_argument("inputs")
    parser.add_argument("--target", required=True)
    parser.add_argument("--tol", type=float, default=None)
    args = parser.parse_args(argv)

    started = time.monotonic()
    log = os.environ.get("BENCH_CALL_LOG")
    if log:  # one line per call: when, which model, how many nodes and heavy layers the target builds
        import onnx as _onnx

        from reprokit.shrink.buildcost import heavy_layers

        proto = _onnx.load(args.model, load_external_data=False)
        nodes, heavy = len(proto.graph.node), heavy_layers(proto)
        with open(log, "a") as handle:
            handle.write(f"{time.time():.3f} {os.path.abspath(args.model)} {nodes} heavy={heavy}\n")
    capture = os.environ.get("BENCH_CAPTURE_DIR")
    if capture:
        import shutil

        os.makedirs(capture, exist_ok=True)
        shutil.copyfile(args.model, os.path.join(capture, f"call{len(os.listdir(capture)):03d}.onnx"))

    import numpy as np
    import onnx

    from reprokit.engine.backends import create_backend
    from reprokit.engine.backends.base import BuildError
    from reprokit.engine.oracle import Kind, Oracle
    from reprokit.engine.worker import WorkerResult
    from reprokit.spec import parse_target
    from reprokit.standalone.compare import Criterion

    spec = parse_target(args.target)
    backend = create_backend(spec)
    precision = backend.precision()
    criterion = Criterion.for_precision(precision, "rel-l2", args.tol)

    graph = onnx.load(args.model, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    input_names = [i.name for i in graph.input if i.name not in initializers]
    output_names = [o.name for o in graph.output]

    available = load_tensors(args.inputs)
    missing = [n for n in input_names if n not in available]
    if missing:
        print(f"ERROR no value for graph input {missing[0]!r} in {args.inputs}")
        return 2
    feeds = {n: np.asarray(available[n]) for n in input_names}
    del available

    golden = load_tensors(args.golden)
    missing = [n for n in output_names if n not in golden]
    if missing:
        print(f"ERROR no reference value for graph output {missing[0]!r} in {args.golden}")
        return 2
    reference = {n: np.asarray(golden[n]) for n in output_names}
    del golden
    for name, value in reference.items():
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            print(f"REFERENCE nonfinite in {name!r}: not a target divergence")
            return 5

    run_started = time.monotonic()
    try:
        result = backend.run(args.model, feeds, None)  # all graph outputs, by name
    except BuildError as exc:
        print(f"BUILD-ERROR {exc.message}")  # whole: the engine's reason may name the node
        return 3
    run_seconds = time.monotonic() - run_started

    oracle = Oracle("ort", str(spec), criterion, precision=precision, workdir=None)
    verdict = oracle.verdict_from(WorkerResult("ok", outputs=result.outputs), reference)
    worst = verdict.worst()
    numbers = (f"worst {worst.name}: rel_l2 {worst.rel_l2:.4g}, nan {worst.target_nan}, inf {worst.target_inf}"
               if worst else "")
    timing = f"(target {run_seconds:.2f} s, total {time.monotonic() - started:.2f} s; {criterion.describe()})"
    if verdict.kind is Kind.AGREE:
        print(f"AGREES {numbers} {timing}")
        return 0
    print(f"DIVERGES {verdict.kind.value} {numbers} {timing}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
