"""Where a shrink run's wall time goes besides the engine (issue 25, "bookkeeping off the critical
path"): pack building and comparison must stay at or under 25% of the wall time on the emulator
for a ~500-node model.

Each case runs ``reprokit shrink … --json`` in a subprocess of its own (the installed console
script, so ``PYTHONPATH`` picks the tree measured) and reads back summary.json: the target calls'
seconds (``calls.target_seconds``: the worker processes, engine start-up included), the wall
time of the capture step, of start-up (``startup`` + ``setup``: interpreter, imports, loading and
folding the model) and of the archive (``pack``) from ``steps``, and reprokit's own bookkeeping from ``bookkeeping``
(``shrink/tally.py``): extraction of candidates, pack assembly, writing models and feeds for the
workers, comparing outputs (verdicts, causal tests). "other" is the rest of the wall time:
reference runs outside the capture (shape tries, confirm), the journal, the summary, and the
steps' own logic.

No polygraphy column: polygraphy's ``debug reduce`` has no packs to build, so there is nothing of
its own to set beside these shares; its calls and wall time are bench_shrink.py's.

    python bench/bench_bookkeeping.py [--only NAME] [--profile NAME] [--baseline TREE] [--json PATH] [--md PATH]

``--baseline TREE`` (another source tree of reprokit, e.g. ``git worktree add /tmp/base main~3``)
runs every case on it too, right before the tree measured, so both rows see the same load on a
shared machine. A tree from before summary.json had ``bookkeeping`` shows zeros there.

``--profile NAME`` runs that case once under cProfile and prints the 25 functions of largest
own time in reprokit's process (engine workers are other processes).
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
REPROKIT = shutil.which("reprokit") or "reprokit"
KINDS = ("extraction", "pack", "write", "compare")


def cases(folder: str) -> list[dict]:
    sys.path.insert(0, BENCH)
    import bench_shrink
    import planted

    bench_shrink._GENERATED["dir"] = folder
    rec = bench_shrink._ocr_model("ch_PP-OCRv4_rec_infer.onnx")
    picture = bench_shrink._picture("rec", 48, 320)
    chain, chain_inputs = planted.save(*planted.chain(n_nodes=502), folder, "planted_chain502")
    sample = os.path.join(ROOT, "samples", "attention_softmax_nan")
    common = ["--input-shapes", "x:1x3x48x320", "--tol", "0.01"]
    return [
        {"name": "ppocrv4_rec bf16", "model": rec, "inputs": picture, "target": "emulate:bf16", "args": common},
        {"name": "ppocrv4_rec fp16", "model": rec, "inputs": picture, "target": "emulate:fp16", "args": common},
        {"name": "planted_chain502", "model": chain, "inputs": chain_inputs, "target": "emulate:fp16", "args": []},
        {"name": "attention_softmax_nan", "model": sample + ".onnx", "inputs": sample + ".inputs.npz",
         "target": "emulate:fp16", "args": []},
    ]


def command(case: dict, out: str) -> list[str]:
    return [REPROKIT, "shrink", case["model"], "--target", case["target"], "--inputs", case["inputs"],
            "-o", out, "--json", *case["args"]]


def run_case(case: dict, work: str, tree: str | None = None) -> dict:
    out = os.path.join(work, "out")
    log = os.path.join(work, "shrink.log")
    name = case["name"] + (" (baseline)" if tree else "")
    env = dict(os.environ)  # thread settings as the user has them: BLAS threads count
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    start = time.monotonic()
    with open(log, "w") as handle:
        rc = subprocess.call(command(case, out), stdout=handle, stderr=subprocess.STDOUT, env=env)
    outside = time.monotonic() - start
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        return {"name": name, "rc": rc, "error": "no summary.json (see the log)", "log": log}
    with open(path) as handle:
        summary = json.load(handle)
    wall = summary["wall_s"]
    steps = {row["step"]: row.get("seconds", 0.0) for row in summary.get("steps", [])}
    books = summary.get("bookkeeping") or {}
    kinds = {k: books.get(k, 0.0) for k in KINDS}
    target = summary["calls"]["target_seconds"]
    capture = steps.get("capture", 0.0)
    startup = steps.get("startup", 0.0) + steps.get("setup", 0.0)
    archive = steps.get("pack", 0.0)
    return {
        "name": name, "target": case["target"], "rc": rc, "status": summary["status"],
        "nodes": summary["original"]["nodes"], "minimal_nodes": summary.get("minimal", {}).get("nodes"),
        "minimal_names": summary.get("minimal", {}).get("node_names"),
        "calls": summary["calls"]["target"], "wall_s": wall, "wall_outside_s": round(outside, 3),
        "target_s": target, "reference_s": summary.get("resources", {}).get("engine_seconds", 0.0) - target,
        "capture_s": capture, "startup_s": round(startup, 3), "archive_s": archive, **{f"{k}_s": v for k, v in kinds.items()},
        "bookkeeping_s": round(sum(kinds.values()), 3),
        "other_s": round(wall - target - capture - startup - archive - sum(kinds.values()), 3),
        "steps": steps,
    }


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def table(rows: list[dict]) -> str:
    head = ("| case | target | nodes → minimal | calls | wall s | target calls s | extraction s | pack s "
            "| write s | compare s | bookkeeping s (share) | capture s | start-up s | archive s | other s |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | | | | | {r['error']} | | | | |")
            continue
        w = r["wall_s"]
        lines.append(
            f"| {r['name']} | {r['target']} | {r['nodes']} → {r['minimal_nodes']} ({r['status']}) | {r['calls']} "
            f"| {w:.1f} | {r['target_s']:.1f} ({pct(r['target_s'], w)}) "
            + " ".join(f"| {r[k + '_s']:.2f} ({pct(r[k + '_s'], w)})" for k in KINDS)
            + f" | **{r['bookkeeping_s']:.1f} ({pct(r['bookkeeping_s'], w)})** "
            + " ".join(f"| {r[k]:.1f} ({pct(r[k], w)})" for k in ("capture_s", "startup_s", "archive_s", "other_s"))
            + " |")
    return "\n".join(lines)


def profile(case: dict, work: str, top: int = 25) -> str:
    import io
    import pstats

    os.makedirs(work, exist_ok=True)
    stats_path = os.path.join(work, "shrink.prof")
    cmd = [sys.executable, "-m", "cProfile", "-o", stats_path, *command(case, os.path.join(work, "out"))]
    subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    text = io.StringIO()
    pstats.Stats(stats_path, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", help="run only the cases whose name contains this")
    parser.add_argument("--profile", help="run this case once under cProfile and print its hot spots")
    parser.add_argument("--baseline", help="another reprokit source tree: each case runs on it too, first")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--md", help="write the table here")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-bookkeeping-")
    try:
        every = cases(root)
        if args.profile:
            case = next(c for c in every if args.profile in c["name"])
            print(profile(case, os.path.join(root, "profile")))
            return 0
        chosen = [c for c in every if not args.only or any(o in c["name"] for o in args.only)]
        rows = []
        for number, case in enumerate(chosen):
            print(f"[{number + 1}/{len(chosen)}] {case['name']} …", file=sys.stderr, flush=True)
            if args.baseline:
                os.makedirs(os.path.join(root, f"base{number}"))
                rows.append(run_case(case, os.path.join(root, f"base{number}"), args.baseline))
            work = os.path.join(root, f"case{number}")
            os.makedirs(work)
            rows.append(run_case(case, work))
        text = table(rows)
        print(text)
        if args.md:
            with open(args.md, "w") as handle:
                handle.write(text + "\n")
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"rows": rows, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "baseline": args.baseline,
                           "load_average": os.getloadavg()}, handle, indent=1)
    finally:
        if args.keep:
            print(f"work directories kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
