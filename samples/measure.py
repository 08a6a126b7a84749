#!/usr/bin/env python
"""Measure the samples written by make_samples.py (the numbers in samples/README.md).

    python samples/measure.py [--dir samples/] [--json out.json] [--check]

For each sample: the onnxruntime fp32 reference (CPU, graph optimizations off), then
emulate:fp16 and emulate:bf16 (reprokit.engine.backends.emulate), OpenVINO CPU with
INFERENCE_PRECISION_HINT=bf16, and emulate:fp16 with the catalog's ``keep_fp32`` nodes left in
fp32. Per output: NaN/Inf counts and relative L2 error ||t - r|| / ||r||. Verdicts:
nonfinite (NaN/Inf where the reference is finite), mismatch (rel L2 > 1e-2 for fp16, > 5e-2 for
bf16), agree. ``--check`` exits 1 when a verdict differs from the catalog's ``expected``.
Run from the repository root with the virtualenv active (it imports reprokit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # reprokit from this checkout when not installed
    sys.path.append(str(HERE.parent))
THRESHOLD = {"fp16": 1e-2, "bf16": 5e-2}


def ort_run(path, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def emulate_run(path, feeds, narrow, keep=frozenset()):
    from reprokit.engine.backends.emulate import emulate_model, round_through

    model = emulate_model(onnx.load(str(path)), narrow, frozenset(keep))
    with tempfile.TemporaryDirectory(prefix="reprokit-samples-") as tmp:
        emulated = os.path.join(tmp, "emulated.onnx")
        onnx.save(model, emulated)
        return ort_run(emulated, {k: round_through(v, narrow) for k, v in feeds.items()})


def openvino_run(path, feeds, hint="bf16"):
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": hint})
    result = compiled.create_infer_request().infer(feeds)
    return {port.get_any_name(): np.asarray(result[port]) for port in compiled.outputs}


def compare(ref, target, precision):
    per_output = {}
    verdict = "agree"
    for name, r in ref.items():
        t = np.asarray(target[name], dtype=np.float32)
        r = np.asarray(r, dtype=np.float32)
        nan, inf = int(np.isnan(t).sum()), int(np.isinf(t).sum())
        finite = np.isfinite(t) & np.isfinite(r)
        if finite.all():
            rel = float(np.linalg.norm(t - r) / max(np.linalg.norm(r), 1e-30))
        else:
            rel = float("nan")
        per_output[name] = {"nan": nan, "inf": inf, "rel_l2": rel}
        if (nan or inf) and np.isfinite(r).all():
            verdict = "nonfinite"
        elif verdict == "agree" and rel > THRESHOLD[precision]:
            verdict = "mismatch"
    return {"verdict": verdict, "outputs": per_output}


def measure(sample_dir: Path) -> list[dict]:
    catalog = json.loads((sample_dir / "catalog.json").read_text())
    rows = []
    for entry in catalog["samples"]:
        path = sample_dir / entry["file"]
        with np.load(sample_dir / entry["inputs"]) as data:
            feeds = {k: data[k] for k in data.files}
        ref = ort_run(path, feeds)
        row = {
            "name": entry["name"],
            "nodes": entry["nodes"],
            "bytes": path.stat().st_size,
            "reference_finite": bool(all(np.isfinite(v).all() for v in ref.values())),
            "reference_absmax": {k: float(np.abs(v).max()) for k, v in ref.items()},
            "emulate:fp16": compare(ref, emulate_run(path, feeds, "fp16"), "fp16"),
            "emulate:bf16": compare(ref, emulate_run(path, feeds, "bf16"), "bf16"),
            "emulate:fp16 keep_fp32": compare(
                ref, emulate_run(path, feeds, "fp16", entry["keep_fp32"]), "fp16"),
            "emulate:fp16 keep fault node only": compare(
                ref, emulate_run(path, feeds, "fp16", {entry["fault_node"]}), "fp16"),
        }
        try:
            row["openvino:bf16"] = compare(ref, openvino_run(path, feeds), "bf16")
        except ImportError as exc:
            row["openvino:bf16"] = {"verdict": f"unavailable ({exc})", "outputs": {}}
        row["expected"] = dict(entry["expected"])
        for target, key in CATALOG_TARGETS.items():
            if key in entry.get("measured", {}):
                row["expected"].setdefault(target, entry["measured"][key]["verdict"])
        rows.append(row)
    return rows


def _sig(value: float):
    return None if value != value else float(f"{value:.3g}")


CATALOG_TARGETS = {"emulate:fp16": "emulate:fp16", "emulate:bf16": "emulate:bf16",
                   "openvino:bf16": "openvino:bf16",
                   "emulate:fp16 keep_fp32": "emulate:fp16+keep_fp32"}


def emit(rows: list[dict]) -> str:
    """The MEASURED table of make_samples.py: target -> (verdict, {output: (nan, inf, rel)})."""
    lines = ["MEASURED: dict[str, dict[str, tuple]] = {"]
    for row in rows:
        lines.append(f"    {json.dumps(row['name'])}: {{")
        for target, key in CATALOG_TARGETS.items():
            result = row[target]
            outs = ", ".join(f"{json.dumps(n)}: ({o['nan']}, {o['inf']}, {_sig(o['rel_l2'])!r})"
                             for n, o in result["outputs"].items())
            lines.append(f"        {json.dumps(key)}: ({json.dumps(result['verdict'])}, {{{outs}}}),")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


def fmt(result) -> str:
    parts = []
    for name, o in result["outputs"].items():
        rel = "n/a" if o["rel_l2"] != o["rel_l2"] else f"{o['rel_l2']:.2e}"
        bad = f" nan={o['nan']} inf={o['inf']}" if o["nan"] or o["inf"] else ""
        parts.append(f"{name}: {rel}{bad}")
    return f"**{result['verdict']}** ({'; '.join(parts)})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(HERE))
    parser.add_argument("--json", help="also write the measurements here")
    parser.add_argument("--check", action="store_true", help="fail if a verdict differs")
    parser.add_argument("--emit", action="store_true",
                        help="print the MEASURED table for make_samples.py")
    args = parser.parse_args(argv)
    rows = measure(Path(args.dir))
    targets = ["emulate:fp16", "emulate:bf16", "openvino:bf16", "emulate:fp16 keep_fp32",
               "emulate:fp16 keep fault node only"]
    failed = False
    for row in rows:
        print(f"## {row['name']}  nodes={row['nodes']}  bytes={row['bytes']:,}  "
              f"reference finite={row['reference_finite']}  absmax={row['reference_absmax']}")
        for target in targets:
            mark = ""
            if target in row["expected"] and row[target]["verdict"] != row["expected"][target]:
                mark = f"   <-- expected {row['expected'][target]}"
                failed = True
            print(f"  {target:34s} {fmt(row[target])}{mark}")
        if not row["reference_finite"]:
            failed = True
    if args.emit:
        print(emit(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if (failed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
