"""The drift window on the real models: ``reprokit shrink`` on each case of bench_precision.py
(same models, feeds, targets and tolerances), and what an accumulated-error run hands over —
the smallest window that drifts on its own (nodes, share of the model, its own error), the
tested fp32 set, and the run's target calls. Usage::

    python bench/bench_window.py [--only TEXT] [--json bench/results/window.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

from bench_precision import MODELS, run_rows  # noqa: E402

from reprokit.engine.session import RunOptions  # noqa: E402
from reprokit.shrink.steps import shrink  # noqa: E402


def run_case(case: dict, work: str) -> dict:
    options = RunOptions(inputs=case.get("inputs"), input_shapes=case.get("shapes", {}), tolerance=case["tol"])
    started = time.monotonic()
    result = shrink(case["path"], case["target"], os.path.join(work, "out"), options=options)
    summary = result.summary
    row = {"case": case["name"], "target": case["target"], "status": summary["status"],
           "nodes": summary["original"]["nodes"], "calls": summary["calls"]["target"],
           "wall_s": round(time.monotonic() - started, 1)}
    if summary["status"] == "accumulated":
        window = summary.get("window") or {}
        tested = summary["attribution"].get("workaround") or {}
        row.update(window={k: window.get(k) for k in ("nodes", "of", "share", "first", "last", "error", "tolerance")}
                   if window else None,
                   workaround={k: tested.get(k) for k in ("size", "calls", "agrees", "error", "note")},
                   start=summary["attribution"].get("divergence_start", {}).get("crosses_at"))
    else:
        row["minimal_nodes"] = summary["minimal"]["nodes"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | target | nodes | shrink says | target calls | drift window (nodes, share, own error / tol) "
             "| tested fp32 set (nodes, calls) |", "| --- | --- | ---: | --- | ---: | --- | --- |"]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['case']} | {r['target']} | — | failed: {r['failed']} | — | — | — |")
            continue
        if r["status"] != "accumulated":
            lines.append(f"| {r['case']} | {r['target']} | {r['nodes']} | {r['status']}: {r['minimal_nodes']} nodes "
                         f"(a local cause) | {r['calls']} | — | — |")
            continue
        w, t = r["window"], r["workaround"]
        window = (f"{w['nodes']} of {w['of']} ({w['share']:.0%}), {w['error']:.3g} / {w['tolerance']:g}"
                  if w else "none smaller than the model drifts alone")
        tested = f"{t['size']}, {t['calls']}" if t.get("agrees") else (t.get("note") or "none")
        lines.append(f"| {r['case']} | {r['target']} | {r['nodes']} | accumulated | {r['calls']} | {window} | {tested} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="substring of the case names to run")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--models", action="append", default=[], help="as bench_precision.py --models")
    args = parser.parse_args()
    MODELS.extend(args.models)
    run_rows("bench-window-", args, run_case, table, quick=False, gpu=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
