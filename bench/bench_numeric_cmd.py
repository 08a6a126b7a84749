"""Side-by-side benchmark on realistic numeric cases (issue 39): transformers exports (≥ 150
nodes; bench/hf_cases.py) with a planted overflow and with an accumulated drift, each reduced by
reprokit under the built-in emulator target and under a numeric ``cmd:`` check that runs the
model (a runner script: loads the ONNX file it is given, runs it, writes its outputs), beside
``polygraphy debug reduce`` (bisect) with the same feeds and the same oracle. A table, not a test.

    python bench/bench_numeric_cmd.py              # 3 models × 2 faults (~10 min on 2 cores)
    python bench/bench_numeric_cmd.py --only bert  # cases whose name holds this
    python bench/bench_numeric_cmd.py --flaky-runs 20  # a 50%-flaky numeric check, 20 shrinks

Both tools run as subprocesses through bench_shrink.py's runners (same measuring, same oracle,
``bench/oracle_check.py``). "right" for a planted overflow: the minimal model holds the planted
Mul (reprokit: is exactly it); for a drift: reprokit ends ``accumulated`` (no node diverges alone:
the attribution), polygraphy's window is judged by the oracle. Writes
``bench/results/numeric_cmd.{md,json}`` (``.partial`` with --only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import bench_shrink as bs  # noqa: E402  (bench/ is not a package)
import hf_cases  # noqa: E402

# rel-L2 tolerances under bf16 storage: about half the whole export's own error (measured with
# `reprokit check MODEL --target emulate:bf16`: EfficientNet 0.037, MobileNetV2 0.255, BERT 0.0064)
DRIFT_TOL = {"efficientnet": 0.02, "mobilenetv2": 0.12, "bert": 0.003}


def cases(work: str) -> list[dict]:
    """One dict per (model, fault): the model, its feeds, the precision and tolerance, what is right."""
    runner = hf_cases.write_runner(os.path.join(work, "runner"))
    out = []
    for name in hf_cases.CASES:
        model, inputs, planted = hf_cases.planted_overflow(name)
        out.append({"name": f"hf_{name} planted overflow", "path": model, "inputs": inputs, "precision": "fp16",
                    "tol": None, "planted": planted, "runner": runner})
        model, inputs = hf_cases.export(name)
        out.append({"name": f"hf_{name} accumulated drift", "path": model, "inputs": inputs, "precision": "bf16",
                    "tol": DRIFT_TOL[name], "planted": None, "runner": runner})
    return out


def shrink_specs(work: str) -> list[dict]:
    """bench_shrink.py's rows for these cases (``BENCH_HF=1 python bench/bench_shrink.py``): each
    case under the built-in target and under the numeric cmd: check."""
    rows = []
    for case in cases(work):
        builtin = f"emulate:{case['precision']}"
        for target in (builtin, hf_cases.cmd_target(case["runner"], case["precision"])):
            row = spec(case, target)
            row["name"] += " cmd" if target.startswith("cmd:") else ""
            rows.append(row)
    return rows


def spec(case: dict, target: str) -> dict:
    """bench_shrink.py's row spec."""
    return {"name": case["name"], "path": case["path"], "target": target, "tol": case["tol"], "shapes": {},
            "inputs": case["inputs"], "expected": None, "sample": False}


def right(case: dict, row: dict, work: str, tool: str) -> str:
    if row.get("error"):
        return "no (" + row["error"][:60] + ")"
    if case["planted"] is None:
        if row.get("status") == "accumulated":
            return "yes (accumulated: no node diverges alone)"
        return f"{row.get('judged', {}).get('kind', '?')} window of {row.get('minimal_nodes')} nodes"
    import onnx

    path = os.path.join(work, "out", "minimal.onnx") if tool == "reprokit" else os.path.join(work, "reduced.onnx")
    names = [n.name for n in onnx.load(path, load_external_data=False).graph.node]
    if case["planted"] not in names:
        return "no (the planted Mul is not in it)"
    return "yes" if names == [case["planted"]] else f"holds it ({len(names)} nodes)"


def run_case(case: dict, work: str) -> dict:
    builtin = f"emulate:{case['precision']}"
    command = hf_cases.cmd_target(case["runner"], case["precision"])
    os.makedirs(work, exist_ok=True)
    feeds = bs.prepare_feeds(spec(case, builtin), work)
    result = {"name": case["name"], "nodes": hf_cases.node_count(case["path"]), "precision": case["precision"],
              "tol": case["tol"], "feeds": feeds, "rows": []}
    for tool, target in (("reprokit", builtin), ("reprokit", command), ("polygraphy", builtin)):
        where = os.path.join(work, f"{tool}-{'cmd' if target.startswith('cmd:') else 'builtin'}")
        run = bs.run_reprokit if tool == "reprokit" else bs.run_polygraphy
        row = run(spec(case, target), feeds, where)
        row.update(check="numeric cmd: runner" if target.startswith("cmd:") else builtin,
                   right=right(case, row, where, tool), est_build_s=bs.build_estimate(row))
        if tool == "reprokit" and not row.get("error"):
            with open(os.path.join(where, "out", "summary.json")) as handle:
                summary = json.load(handle)
            row["step_calls"] = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
        result["rows"].append(row)
    return result


HEADER = ["case", "nodes", "tool", "check", "target calls", "calls by step", "nodes built",
          "est. TensorRT build (s)", "wall (s)", "minimal nodes", "right"]


def table(results: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for res in results:
        for row in res["rows"]:
            steps = ", ".join(f"{k} {v}" for k, v in row.get("step_calls", {}).items())
            minimal = "accumulated" if row.get("status") == "accumulated" else bs.fmt(row.get("minimal_nodes"))
            lines.append("| " + " | ".join([
                res["name"] + (f" (tol {res['tol']:g})" if res["tol"] else ""), str(res["nodes"]), row["tool"],
                row["check"], bs.fmt(row.get("calls")), steps or "—", bs.fmt(row.get("nodes_built")),
                bs.fmt(row.get("est_build_s")), bs.fmt(row.get("wall_s")), minimal, row["right"]]) + " |")
    return "\n".join(lines)


def totals(results: list[dict]) -> str:
    """Calls of each reprokit check over polygraphy's, summed over the cases where all three ran."""
    done = [r for r in results if not any(row.get("error") for row in r["rows"])]
    sums = {}
    for res in done:
        for row in res["rows"]:
            key = f"{row['tool']} {row['check'].split(':')[0]}"
            calls, wall = sums.get(key, (0, 0.0))
            sums[key] = (calls + (row.get("calls") or 0), wall + (row.get("wall_s") or 0.0))
    return "; ".join(f"{key}: {calls} calls, {wall:.0f} s" for key, (calls, wall) in sums.items()) + \
        f" ({len(done)} cases where all three finished)"


# A numeric runner that shows the fp16 overflow on half its calls at random and computes in fp32
# (agreeing) on the others: how a flaky engine behind a numeric check ends.
FLAKY_RUNNER = """\
import random
import sys

import numpy as np

from reprokit.engine.backends import create_backend
from reprokit.spec import parse_target

model, inputs, outputs = sys.argv[1:4]
with np.load(inputs) as data:
    feeds = {k: data[k] for k in data.files}
engine = "emulate:fp16" if random.SystemRandom().random() < 0.5 else "ort"
np.savez(outputs, **create_backend(parse_target(engine)).run(model, feeds, None).outputs)
"""


def flaky(runs: int, work: str) -> str:
    """``runs`` shrinks of the bundled attention sample under the flaky runner: exit codes, and
    whether a run that ended 0 found the sample's overflowing MatMul."""
    import collections
    import subprocess

    runner = os.path.join(work, "flaky_runner.py")
    with open(runner, "w") as handle:
        handle.write(FLAKY_RUNNER)
    sample = os.path.join(bs.ROOT, "samples", "attention_softmax_nan.onnx")
    target = f"cmd:precision=fp16:{sys.executable} {runner} {{model}} {{inputs}} {{outputs}}"
    codes, right_done = collections.Counter(), 0
    for number in range(runs):
        out = os.path.join(work, f"flaky{number}")
        proc = subprocess.run([bs.REPROKIT, "shrink", sample, "--target", target, "-o", out, "--no-shrink-shapes",
                               "--inputs", sample.replace(".onnx", ".inputs.npz")], capture_output=True, text=True)
        codes[proc.returncode] += 1
        if proc.returncode == 0:
            with open(os.path.join(out, "summary.json")) as handle:
                right_done += json.load(handle)["minimal"]["ops"] == ["MatMul"]
        print(f"flaky run {number + 1}/{runs}: exit {proc.returncode}", flush=True)
    return (f"A numeric check flaky at 50% (fp16 overflow or fp32 at random per call), {runs} shrinks of "
            f"samples/attention_softmax_nan.onnx: exit codes " + ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))
            + f"; of the {codes[0]} that ended 0, {right_done} found the overflowing MatMul.\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="cases whose name holds this (repeatable)")
    parser.add_argument("--flaky-runs", type=int, default=0, help="only: N shrinks under a 50%%-flaky numeric check")
    args = parser.parse_args(argv)
    import tempfile

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="bench-numeric-cmd-")
    if args.flaky_runs:
        text = flaky(args.flaky_runs, work)
        with open(os.path.join(bs.RESULTS, "numeric_cmd.flaky.md"), "w") as handle:
            handle.write(text)
        print(text)
        return 0
    chosen = [c for c in cases(work) if not args.only or any(o in c["name"] for o in args.only)]
    results = []
    for number, case in enumerate(chosen):
        print(f"[{number + 1}/{len(chosen)}] {case['name']}", flush=True)
        results.append(run_case(case, os.path.join(work, f"case{number}")))
        print("\n".join(table(results[-1:]).splitlines()[2:]), flush=True)
    text = table(results) + "\n\n" + totals(results) + f"\n\nBenchmark wall time {time.monotonic() - started:.0f} s.\n"
    stem = os.path.join(bs.RESULTS, "numeric_cmd" + (".partial" if args.only else ""))
    with open(stem + ".md", "w") as handle:
        handle.write(text)
    with open(stem + ".json", "w") as handle:
        json.dump({"results": results, "wall_s": time.monotonic() - started}, handle, indent=1, default=str)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
