"""Fit TensorRT-RTX build seconds to what a call builds, from bench/trt_buildcost.py's raw lines.

    python bench/trt_buildcost_fit.py RAW.jsonl [--estimator RAW_WITH_SINGLES.jsonl]

A table, not a test. Least squares over every measured file (the lower of its two cold builds):

- ``nodes``:   seconds ≈ a + b·nodes (ONNX nodes: what reprokit and polygraphy know without
  TensorRT, so the fit bench_shrink.py applies to their calls: a·calls + b·nodes built);
- ``layers``:  seconds ≈ a + b·layers (TensorRT network layers after parsing);
- ``full``:    seconds ≈ a + b·layers + c·distinct + d·(inputs + outputs) (distinct layer
  configurations; a pack's graph inputs and outputs, one per cut and member output);
- ``heavy``:   seconds ≈ a + b·heavy (layers whose kernels the builder chooses among many:
  convolution, matrix multiply, softmax, normalization, reduce; constants, shape arithmetic and
  elementwise layers cost a build next to nothing — bench/results/buildcost/rtx_h200_passfail.md).

Then, per captured run, the sum of builds each tool made: cold, and with one timing cache shared
by every build of the run.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

HEAVY = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "SOFTMAX", "NORMALIZATION", "REDUCE")


def load(path: str) -> tuple[dict, list[dict]]:
    with open(path) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    head = lines[0] if "trt_version" in lines[0] else {}
    rows = [r for r in lines if r.get("cold_s") and not r.get("error")]
    for r in rows:
        r["build_s"] = min(r["cold_s"])
        r["io"] = r.get("inputs", 0) + r.get("outputs", 0)
        r["heavy"] = sum(n for kind, n in (r.get("layer_kinds") or {}).items() if kind in HEAVY)
    head["failed"] = [r for r in lines if r.get("error") and r.get("file")]
    return head, rows


def fit(rows: list[dict], columns: list[str]) -> tuple[np.ndarray, float, float]:
    """Coefficients (intercept first), R² and the median relative error of the prediction."""
    x = np.array([[1.0] + [float(r[c]) for c in columns] for r in rows])
    y = np.array([r["build_s"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    r2 = 1 - float(np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    rel = float(np.median(np.abs(pred - y) / y))
    return coef, r2, rel


FITS = {"nodes": ["nodes"], "layers": ["layers"], "full": ["layers", "distinct_layers", "io"], "heavy": ["heavy"]}


def estimator(path: str) -> tuple[float, float]:
    """(seconds a call costs at least, seconds per ONNX node built) for estimating a run's build
    seconds from what both tools report, calls and nodes built: ``a·calls + b·nodes``. ``a`` is
    the median build of one node alone (the floor every call pays), ``b`` the least-squares slope
    through that floor over every file of more than one node."""
    _, rows = load(path)
    floor = float(np.median([r["build_s"] for r in rows if r["kind"] == "single"]))
    big = [r for r in rows if r["kind"] != "single"]
    nodes = np.array([float(r["nodes"]) for r in big])
    extra = np.array([r["build_s"] - floor for r in big])
    return floor, float(np.sum(extra * nodes) / np.sum(nodes * nodes))


def coefficients(path: str) -> dict:
    """{fit name: (coefficients, r2, median relative error)} for the raw lines at ``path``."""
    _, rows = load(path)
    return {name: fit(rows, cols) for name, cols in FITS.items()}


def markdown(path: str, estimator_path: str | None = None) -> str:
    head, rows = load(path)
    out = [
        f"TensorRT-RTX {head.get('trt_version', '?')}, built for compute capability {head.get('cc', '?')}; "
        f"{len(rows)} files.",
        "",
        "| fit | coefficients | R² | median rel. error |",
        "| --- | --- | --- | --- |",
    ]
    for name, cols in FITS.items():
        coef, r2, rel = fit(rows, cols)
        terms = [f"{coef[0]:.3f} s"] + [
            f"{c * 1000:.2f} ms·{col}" for c, col in zip(coef[1:], cols)
        ]
        out.append(f"| {name} | {' + '.join(terms)} | {r2:.3f} | {rel:.0%} |")
    out += [
        "",
        "| case | file | kind | nodes | members | layers | distinct | in+out | build s (cold, min of 2) "
        "| shared cache s | engine KiB |",
        "| --- | " * 11,
    ]
    out[-1] = out[-1].strip()
    for r in rows:
        out.append(
            f"| {r['case']} | {r['file']} | {r['kind']} | {r['nodes']} | {r['members']} | {r['layers']} | "
            f"{r['distinct_layers']} | {r['io']} | {r['build_s']:.3f} | {r.get('shared_s', '')} | "
            f"{r.get('engine_bytes', 0) // 1024} |"
        )
    runs: dict[str, dict] = {}
    for r in rows:
        if r["kind"] in ("run", "polygraphy"):
            tool = "reprokit" if r["kind"] == "run" else "polygraphy"
            case = r["case"].split("_", 1)[1]
            entry = runs.setdefault(case, {}).setdefault(
                tool,
                {"calls": 0, "nodes": 0, "cold": 0.0, "shared": 0.0, "distinct": 0, "layers": 0},
            )
            entry["distinct"] += r["distinct_layers"]
            entry["layers"] += r["layers"]
            entry["calls"] += 1
            entry["nodes"] += r["nodes"]
            entry["cold"] += r["build_s"]
            entry["heavy"] = entry.get("heavy", 0) + r["heavy"]
            entry["shared"] += r.get("shared_s", r["build_s"])
    out += [
        "",
        "| run | tool | calls | nodes built | layers built | Σ distinct layer configs | build s (cold) "
        "| build s (one shared cache) | estimated s (a·calls + b·nodes) |",
        "|" + " --- |" * 9,
    ]
    a, b = estimator(estimator_path or path)
    for case, tools in runs.items():
        for tool, e in tools.items():
            out.append(
                f"| {case} | {tool} | {e['calls']} | {e['nodes']} | {e['layers']} | {e['distinct']} | "
                f"{e['cold']:.2f} | {e['shared']:.2f} | {a * e['calls'] + b * e['nodes']:.2f} |"
            )
        if len(tools) == 2:
            rk, pg = tools["reprokit"], tools["polygraphy"]
            est = (a * rk["calls"] + b * rk["nodes"]) / (a * pg["calls"] + b * pg["nodes"])
            cells = [
                f"{rk[k] / pg[k]:.2f}×"
                for k in ("calls", "nodes", "layers", "distinct", "cold", "shared")
            ]
            out.append(f"| {case} | **reprokit/polygraphy** | {' | '.join(cells)} | {est:.2f}× |")
    out += [
        "",
        f"Estimator (bench_shrink.py): a = {a:.4f} s per call, b = {b * 1000:.2f} ms per node built.",
    ]
    failed: dict[str, int] = {}
    for r in head["failed"]:
        failed[r["case"]] = failed.get(r["case"], 0) + 1
    out += [
        "",
        "Builds that failed (not in the sums above; the harness gives dynamic inputs one shape but no "
        "values to shape-tensor inputs): "
        + (", ".join(f"{case} {n}" for case, n in sorted(failed.items())) or "none") + ".",
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--estimator", help="raw lines holding single-node builds, for a·calls + b·nodes "
                        "(default: RAW itself)")
    args = parser.parse_args()
    print(markdown(args.raw, args.estimator))
    return 0


if __name__ == "__main__":
    sys.exit(main())
