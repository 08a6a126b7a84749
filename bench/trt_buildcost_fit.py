"""Fit TensorRT-RTX build seconds to what a call builds, from bench/trt_buildcost.py's raw lines.

    python bench/trt_buildcost_fit.py RAW.jsonl [--estimator RAW_WITH_SINGLES.jsonl]
    python bench/trt_buildcost_fit.py --compare RAW.jsonl RAW2.jsonl [--captured CASES_DIR ...]

A table, not a test. Least squares over every measured file (the lower of its two cold builds):

- ``nodes``:   seconds ≈ a + b·nodes (ONNX nodes: what reprokit and polygraphy know without
  TensorRT, so the fit bench_shrink.py applies to their calls: a·calls + b·nodes built);
- ``layers``:  seconds ≈ a + b·layers (TensorRT network layers after parsing);
- ``full``:    seconds ≈ a + b·layers + c·distinct + d·(inputs + outputs) (distinct layer
  configurations; a pack's graph inputs and outputs, one per cut and member output);
- ``heavy``:   seconds ≈ a + b·heavy (layers whose kernels the builder chooses among many:
  convolution, matrix multiply, softmax, normalization; constants, shape arithmetic, reduce and
  elementwise layers cost a build next to nothing — bench/results/buildcost/rtx_h200_passfail.md).
  The estimate of record (reprokit/shrink/buildcost.py: ESTIMATE) is this fit on the H200's lines.

``--compare``: every term set beside ``heavy`` (inputs, outputs, heavy², a call holding any heavy
layer, light layers, distinct configurations) fitted per machine and over both, R² and median
relative error each, what each machine's fit predicts on the other's builds, the packs with
hundreds of outputs apart; with ``--captured`` (trt_buildcost_prepare.py's folders, joined by case
and file name, node counts checked) how far reprokit's ONNX-side heavy count is from TensorRT's.

Then, per captured run, the sum of builds each tool made: cold, and with one timing cache shared
by every build of the run.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from reprokit.shrink.buildcost import ESTIMATE, heavy_layers

# TensorRT layer kinds the heavy count holds; REDUCE is left out: alone it builds as fast as an
# elementwise layer (11-14 ms on the H100) and the fit without it is as good on both machines
# (--compare's "heavy+reduce" row).
HEAVY = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "SOFTMAX", "NORMALIZATION")


def load(path: str) -> tuple[dict, list[dict]]:
    with open(path) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    head = lines[0] if "trt_version" in lines[0] else {}
    rows = [r for r in lines if r.get("cold_s") and not r.get("error")]
    for r in rows:
        r["build_s"] = min(r["cold_s"])
        r["io"] = r.get("inputs", 0) + r.get("outputs", 0)
        kinds = r.get("layer_kinds") or {}
        r["heavy"] = sum(n for kind, n in kinds.items() if kind in HEAVY)
        r["reduce"] = kinds.get("REDUCE", 0)
        r["heavy2"] = r["heavy"] ** 2 / 1000  # per thousand: its coefficient reads in ms
        r["any_heavy"] = 1 if r["heavy"] else 0
        r["light"] = r["layers"] - r["heavy"] - kinds.get("CONSTANT", 0)
        r["inputs"], r["outputs"] = r.get("inputs", 0), r.get("outputs", 0)
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


FITS = {
    "nodes": ["nodes"],
    "layers": ["layers"],
    "full": ["layers", "distinct_layers", "io"],
    "heavy": ["heavy"],
}


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


def _estimate(entry: dict) -> float:
    """The estimate of record of one tool's calls on one run (light-only calls priced apart)."""
    return ESTIMATE.seconds(entry["calls"], entry["heavy"], entry["light"], entry["light_nodes"])


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
            entry["light"] = entry.get("light", 0) + (0 if r["heavy"] else 1)
            entry["light_nodes"] = entry.get("light_nodes", 0) + (0 if r["heavy"] else r["nodes"])
            entry["shared"] += r.get("shared_s", r["build_s"])
    out += [
        "",
        "| run | tool | calls | nodes built | layers built | Σ distinct layer configs | build s (cold) "
        "| build s (one shared cache) | estimated s (a·calls + b·nodes) | estimated s (heavy layers) |",
        "|" + " --- |" * 10,
    ]
    a, b = estimator(estimator_path or path)
    for case, tools in runs.items():
        for tool, e in tools.items():
            out.append(
                f"| {case} | {tool} | {e['calls']} | {e['nodes']} | {e['layers']} | {e['distinct']} | "
                f"{e['cold']:.2f} | {e['shared']:.2f} | {a * e['calls'] + b * e['nodes']:.2f} | "
                f"{_estimate(e):.2f} |"
            )
        if len(tools) == 2:
            rk, pg = tools["reprokit"], tools["polygraphy"]
            est = (a * rk["calls"] + b * rk["nodes"]) / (a * pg["calls"] + b * pg["nodes"])
            cells = [
                f"{rk[k] / pg[k]:.2f}×"
                for k in ("calls", "nodes", "layers", "distinct", "cold", "shared")
            ]
            heavy = _estimate(rk) / _estimate(pg)
            out.append(
                f"| {case} | **reprokit/polygraphy** | {' | '.join(cells)} | {est:.2f}× | {heavy:.2f}× |"
            )
    out += [
        "",
        f"Estimators: by nodes a = {a:.4f} s per call, b = {b * 1000:.2f} ms per node built; by heavy layers "
        f"(the estimate of record, reprokit/shrink/buildcost.py) {ESTIMATE.per_call_s:.4f} s per call, "
        f"{ESTIMATE.per_heavy_s * 1000:.2f} ms per heavy layer; a call of light layers only "
        f"{ESTIMATE.per_light_call_s:.4f} s + {ESTIMATE.per_light_node_s * 1000:.3f} ms per node.",
    ]
    failed: dict[str, int] = {}
    for r in head["failed"]:
        failed[r["case"]] = failed.get(r["case"], 0) + 1
    out += [
        "",
        "Builds that failed (not in the sums above; the harness gives dynamic inputs one shape but no "
        "values to shape-tensor inputs): "
        + (", ".join(f"{case} {n}" for case, n in sorted(failed.items())) or "none")
        + ".",
    ]
    return "\n".join(out)


TERMS = {
    "nodes": ["nodes"],
    "layers": ["layers"],
    "heavy": ["heavy"],
    "heavy+reduce": ["heavy", "reduce"],
    "heavy+inputs+outputs": ["heavy", "io"],
    "heavy+inputs": ["heavy", "inputs"],
    "heavy+outputs": ["heavy", "outputs"],
    "heavy+heavy²": ["heavy", "heavy2"],
    "heavy+any heavy": ["heavy", "any_heavy"],
    "heavy+light layers": ["heavy", "light"],
    "heavy+distinct": ["heavy", "distinct_layers"],
}


def _score(coef: np.ndarray, rows: list[dict], columns: list[str]) -> str:
    """R², median relative error and Σpredicted/Σmeasured of ``coef`` on ``rows``."""
    x = np.array([[1.0] + [float(r[c]) for c in columns] for r in rows])
    y = np.array([r["build_s"] for r in rows])
    pred = x @ coef
    r2 = 1 - float(np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    return f"{r2:.3f} / {float(np.median(np.abs(pred - y) / y)):.0%} / {pred.sum() / y.sum():.2f}"


def compare(paths: list[str], captured: list[str]) -> str:
    machines = {}
    for path in paths:
        head, rows = load(path)
        machines[f"{path.rsplit('/', 1)[-1].split('.')[0]} ({len(rows)})"] = rows
    machines[f"both ({sum(len(r) for r in machines.values())})"] = [
        r for rows in machines.values() for r in rows
    ]
    names = list(machines)
    out = [
        "Per term set, per machine: coefficients (intercept, then ms per unit; heavy² per thousand), "
        "R² / median relative error.",
        "",
        "| terms | " + " | ".join(names) + " |",
        "|" + " --- |" * (len(names) + 1),
    ]
    for label, cols in TERMS.items():
        cells = []
        for rows in machines.values():
            coef, r2, rel = fit(rows, cols)
            terms = " + ".join(
                [f"{coef[0]:.3f} s"] + [f"{c * 1000:.2f}·{col}" for c, col in zip(coef[1:], cols)]
            )
            cells.append(f"{terms}: {r2:.3f} / {rel:.0%}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    single = [n for n in names if not n.startswith("both")]
    out += [
        "",
        "Each machine's `heavy` fit, the estimate of record and the per-node estimator applied to every "
        "machine's builds: R² / median relative error / Σpredicted ÷ Σmeasured.",
        "",
        "| fit | " + " | ".join(single) + " |",
        "|" + " --- |" * (len(single) + 1),
    ]
    for name in single:
        coef, _, _ = fit(machines[name], ["heavy"])
        out.append(
            f"| heavy fit of {name} | "
            + " | ".join(_score(coef, machines[n], ["heavy"]) for n in single)
            + " |"
        )
    out.append(
        "| estimate of record | "
        + " | ".join(
            _predicted(lambda r: ESTIMATE.call_seconds(r["nodes"], r["heavy"]), machines[n])
            for n in single
        )
        + " |"
    )
    nodes = np.array([0.0135, 0.00307])
    out.append(
        "| per-node estimator | "
        + " | ".join(_score(nodes, machines[n], ["nodes"]) for n in single)
        + " |"
    )
    out += [
        "",
        "The estimate of record's prediction ÷ measured by build size (heavy layers) and graph inputs + "
        "outputs (a survey pack: hundreds): median (range).",
        "",
        "| machine | heavy layers | in+out | builds | predicted ÷ measured |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in single:
        for low, high in ((0, 20), (20, 150), (150, 10**6)):
            for io_low, io_high in ((0, 100), (100, 10**6)):
                part = [
                    r
                    for r in machines[name]
                    if low <= r["heavy"] < high and io_low <= r["io"] < io_high
                ]
                if not part:
                    continue
                ratio = [
                    ESTIMATE.call_seconds(r["nodes"], r["heavy"]) / max(r["build_s"], 1e-3)
                    for r in part
                ]
                out.append(
                    f"| {name} | {low}–{high if high < 10**6 else '…'} | "
                    f"{'< 100' if io_low == 0 else '≥ 100'} | {len(part)} | {np.median(ratio):.2f} "
                    f"({min(ratio):.2f}–{max(ratio):.2f}) |"
                )
    out += ["", *light_calls(machines, single), "", *outputs_term(machines, single)]
    if captured:
        out += ["", *validate(paths, captured)]
    return "\n".join(out)


def light_calls(machines: dict, single: list[str]) -> list[str]:
    """A lower price for calls of light layers only: candidates fitted on the H200's lines (the
    machine of record), each scored per machine on the light-only calls and the rest apart."""
    h200 = next((machines[n] for n in single if "h200" in n), machines[single[-1]])
    light = [r for r in h200 if not r["heavy"]]
    joint, _, _ = fit(h200, ["any_heavy", "heavy"])
    by_nodes, _, _ = fit(light, ["nodes"])
    mean = float(np.mean([r["build_s"] for r in light]))
    old = (ESTIMATE.per_call_s, ESTIMATE.per_heavy_s)
    candidates = {
        f"one price a call: {old[0]:.3f} s + {old[1] * 1000:.2f} ms·heavy (before)": lambda r: (
            old[0] + old[1] * r["heavy"]
        ),
        f"joint fit: {joint[0]:.3f} + {joint[1]:.3f}·[heavy > 0] + {joint[2] * 1000:.2f} ms·heavy": lambda r: (
            joint[0] + joint[1] * (r["heavy"] > 0) + joint[2] * r["heavy"]
        ),
        f"heavy calls as before, light calls {mean:.4f} s (their mean)": lambda r: (
            old[0] + old[1] * r["heavy"] if r["heavy"] else mean
        ),
        f"heavy calls as before, light calls {by_nodes[0]:.4f} s + {by_nodes[1] * 1000:.3f} ms·nodes": lambda r: (
            old[0] + old[1] * r["heavy"] if r["heavy"] else by_nodes[0] + by_nodes[1] * r["nodes"]
        ),
        "estimate of record (buildcost.ESTIMATE.call_seconds)": lambda r: ESTIMATE.call_seconds(
            r["nodes"], r["heavy"]
        ),
    }
    out = [
        "Calls of light layers only (no heavy layer), priced apart: candidates fitted on the H200's lines, "
        "R² / median relative error / Σpredicted ÷ Σmeasured on every build, the light-only ones and the rest.",
        "",
        "| candidate | machine | all | light-only | with heavy layers |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, price in candidates.items():
        for name in single:
            rows = machines[name]
            parts = [rows, [r for r in rows if not r["heavy"]], [r for r in rows if r["heavy"]]]
            cells = [f"{_predicted(price, part)} ({len(part)})" for part in parts]
            out.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    return out


def outputs_term(machines: dict, single: list[str]) -> list[str]:
    """A term for big builds with many outputs (+ c·outputs on calls holding heavy layers) beside
    the estimate of record, scored per machine on every build and on those of ≥ 100 outputs and
    fewer apart. Only the H100's lines hold such builds (survey packs); two slopes from them: the
    one through zero of the H100's builds' excess over the estimate (which also takes in that
    machine's dearer heavy layers), and the H100's own heavy+outputs fit's outputs price scaled to
    the H200 by the two machines' heavy prices."""
    h100 = next((machines[n] for n in single if "h100" in n), None)
    if h100 is None:
        return []

    def record(r):
        return ESTIMATE.call_seconds(r["nodes"], r["heavy"])

    heavy = [r for r in h100 if r["heavy"]]
    excess = np.array([r["build_s"] - record(r) for r in heavy])
    outputs = np.array([float(r["outputs"]) for r in heavy])
    slope = float(np.sum(excess * outputs) / np.sum(outputs * outputs))
    own, _, _ = fit(h100, ["heavy", "outputs"])
    scaled = own[2] * ESTIMATE.per_heavy_s / own[1]
    candidates = {"estimate of record": record}
    for label, c in (
        (f"the H100's excess over it, {slope * 1000:.2f} ms", slope),
        (f"the H100's own fit scaled to the H200, {scaled * 1000:.2f} ms", scaled),
    ):
        candidates[f"+ c·outputs, c = {label}"] = lambda r, c=c: (
            record(r) + (c * r["outputs"] if r["heavy"] else 0)
        )
    out = [
        "A term for big builds with many outputs: R² / median relative error / Σpredicted ÷ Σmeasured "
        "(builds).",
        "",
        "| candidate | machine | all | ≥ 100 outputs | < 100 outputs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, price in candidates.items():
        for name in single:
            rows = machines[name]
            parts = [
                rows,
                [r for r in rows if r["outputs"] >= 100],
                [r for r in rows if r["outputs"] < 100],
            ]
            cells = [
                f"{_predicted(price, part)} ({len(part)})" if part else "— (0)" for part in parts
            ]
            out.append(f"| {label} | {name} | " + " | ".join(cells) + " |")
    return out


def _predicted(price, rows: list[dict]) -> str:
    y = np.array([r["build_s"] for r in rows])
    pred = np.array([price(r) for r in rows])
    r2 = 1 - float(np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    return f"{r2:.3f} / {float(np.median(np.abs(pred - y) / y)):.0%} / {pred.sum() / y.sum():.2f}"


def validate(paths: list[str], folders: list[str]) -> list[str]:
    """reprokit's ONNX-side count (buildcost.heavy_layers) against TensorRT's heavy layer kinds,
    per file of the raw lines found in a captured folder (same case and file, same node count)."""
    import os

    import onnx

    out = [
        "ONNX-side heavy count (reprokit/shrink/buildcost.py heavy_layers) against TensorRT's parsed "
        "network, per file joined by case and file name:",
        "",
        "| raw | joined | equal | ONNX − TensorRT (count of files) | not found / node count differs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path in paths:
        with open(path) as handle:
            lines = [json.loads(line) for line in handle if line.strip()]
        delta: dict[int, int] = {}
        missing = differs = 0
        for r in lines:
            if not r.get("file") or not r.get("layer_kinds"):
                continue
            found = [os.path.join(f, r["case"], r["file"]) for f in folders]
            found = [f for f in found if os.path.exists(f)]
            if not found:
                missing += 1
                continue
            model = onnx.load(found[0], load_external_data=False)
            if len(model.graph.node) != r["nodes"]:
                differs += 1
                continue
            d = heavy_layers(model) - sum(
                n for kind, n in r["layer_kinds"].items() if kind in HEAVY
            )
            delta[d] = delta.get(d, 0) + 1
        joined = sum(delta.values())
        cells = ", ".join(f"{d:+d}: {n}" for d, n in sorted(delta.items()))
        out.append(
            f"| {path.rsplit('/', 1)[-1]} | {joined} | {delta.get(0, 0)} | {cells} | {missing} / {differs} |"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", nargs="+")
    parser.add_argument(
        "--estimator",
        help="raw lines holding single-node builds, for a·calls + b·nodes (default: RAW itself)",
    )
    parser.add_argument(
        "--compare", action="store_true", help="term sets per machine over every RAW given"
    )
    parser.add_argument(
        "--captured",
        action="append",
        default=[],
        help="with --compare: a trt_buildcost_prepare.py output folder to check the ONNX-side count on",
    )
    args = parser.parse_args()
    print(
        compare(args.raw, args.captured) if args.compare else markdown(args.raw[0], args.estimator)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
