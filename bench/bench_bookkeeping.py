"""Where a shrink run's wall time goes besides the engine (issue 25, "bookkeeping off the critical
path"): pack building and comparison must stay at or under 25% of the wall time on the emulator
for a ~500-node model; issue 39: reprokit's own work (everything but the engine's and the
reference's runs) at or under 15% of the wall time on the emulator for a ~3,000-node model — the
Swin case, a ``transformers`` SwinModel (its default config: swin-tiny's shape, random weights
seeded, no hub download) exported by torch.onnx at opset 17 (3,647 nodes), shrunk under
``emulate:fp16`` at ``--tol 0.001`` (its fp16 drift, rel-l2 0.0014: an accumulated error).

Each case runs ``reprokit shrink … --json`` in a subprocess of its own (the installed console
script, so ``PYTHONPATH`` picks the tree measured) and reads back summary.json: the target calls'
seconds (``calls.target_seconds``: the worker processes, engine start-up included), the wall
time of the capture step, of start-up (``startup`` + ``setup``: interpreter, imports, loading and
folding the model) and of the archive (``pack``) from ``steps``, and reprokit's own bookkeeping from ``bookkeeping``
(``shrink/tally.py``): extraction of candidates (their cut tensors' fp16/bf16 check included),
pack assembly (which members go in which pack included), writing models and feeds for the
workers and the drift window's files, comparing outputs (verdicts, causal tests). "other" is
the rest of the wall time: reference runs outside the capture (shape tries, confirm; none on the
Swin row), the journal and summary.json written after each step, the budget and progress
lines, and the steps' own logic between calls (the precision workaround's candidate lists).

"own s (share)" is the wall time less the engine seconds measured (summary.json's
``resources.engine_seconds``: the target calls, the reference runs — the fold's check and the
archive's check of both engines too — and the engine runs the archive's tools recorded inside
themselves while reprokit waited for them; "reference s" is that less the target calls): what
issue 39's 15% bounds. Of the archive step's wait for the bundled repro.py and polygraphy's
runs (``pack_tool_seconds``) only the seconds during which one of their engine runs was going,
as they recorded it (``pack_tool_engine_seconds``: repro.py around each engine run, polygraphy
around onnxruntime's session creation and runs), are engine time; the rest of the wait — their
interpreters, imports, model loading, ``inspect model`` — stays in "own". ``--polygraphy`` runs polygraphy's
documented workflow (bench_shrink.py's ``run_polygraphy``: sanitize, mark all, data merge, debug
reduce in bisect mode with the same oracle) on the same feeds right after, and sets its wall time
and calls beside the row (polygraphy has no packs: its own work is not split out).

    python bench/bench_bookkeeping.py [--only NAME] [--profile NAME] [--baseline TREE] [--polygraphy]
                                      [--json PATH] [--md PATH]

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


def swin(folder: str) -> tuple[str, str]:
    """The Swin export of issue 39 and one seeded input image, made once per work folder:
    ``SwinModel(SwinConfig())`` with seeded random weights (nothing downloaded)."""
    import numpy as np

    path, inputs = os.path.join(folder, "swin.onnx"), os.path.join(folder, "swin.inputs.npz")
    if not os.path.exists(path):
        script = ("import torch, sys\n"
                  "from transformers import SwinConfig, SwinModel\n"
                  "torch.manual_seed(0)\n"
                  "model = SwinModel(SwinConfig()).eval()\n"
                  "torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), sys.argv[1], input_names=['pixel_values'],"
                  " output_names=['last_hidden_state', 'pooler_output'], opset_version=17, dynamo=False)\n")
        subprocess.run([sys.executable, "-c", script, path], check=True, capture_output=True, cwd=folder)
    if not os.path.exists(inputs):
        sys.path.insert(0, ROOT)
        from reprokit.standalone.arrays import save_npz

        image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        save_npz(inputs, {"pixel_values": image})
    return path, inputs


def cases(folder: str) -> list[dict]:
    sys.path.insert(0, BENCH)
    import bench_shrink
    import planted

    bench_shrink._GENERATED["dir"] = folder
    rec = bench_shrink._ocr_model("ch_PP-OCRv4_rec_infer.onnx")
    picture = bench_shrink._picture("rec", 48, 320)
    chain, chain_inputs = planted.save(*planted.chain(n_nodes=502), folder, "planted_chain502")
    sample = os.path.join(ROOT, "samples", "attention_softmax_nan")
    common = ["--input-shapes", "x:1x3x48x320", "--tol", "0.01"]  # "tol": the same, for polygraphy's oracle
    swin_model, swin_inputs = swin(folder)
    return [
        {"name": "swin fp16", "model": swin_model, "inputs": swin_inputs, "target": "emulate:fp16",
         "args": ["--tol", "0.001"], "tol": 0.001},
        {"name": "ppocrv4_rec bf16", "model": rec, "inputs": picture, "target": "emulate:bf16", "args": common,
         "tol": 0.01},
        {"name": "ppocrv4_rec fp16", "model": rec, "inputs": picture, "target": "emulate:fp16", "args": common,
         "tol": 0.01},
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
    with open(log, "w") as handle:  # cwd: the work folder (a worker's ``python -m`` reads its cwd first)
        rc = subprocess.call(command(case, out), stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=work)
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
    reference = summary.get("resources", {}).get("engine_seconds", 0.0) - target
    capture = steps.get("capture", 0.0)
    startup = steps.get("startup", 0.0) + steps.get("setup", 0.0)
    archive = steps.get("pack", 0.0)
    resources = summary.get("resources", {})
    return {
        "name": name, "target": case["target"], "rc": rc, "status": summary["status"],
        "signature": summary.get("signature", {}).get("kind"),
        "nodes": summary["original"]["nodes"], "minimal_nodes": summary.get("minimal", {}).get("nodes"),
        "minimal_names": summary.get("minimal", {}).get("node_names"),
        "calls": summary["calls"]["target"], "wall_s": wall, "wall_outside_s": round(outside, 3),
        "target_s": target, "reference_s": round(reference, 3), "own_s": round(wall - target - reference, 3),
        "file_nodes": summary["original"].get("file_nodes"), "window": summary.get("window"),
        "capture_s": capture, "startup_s": round(startup, 3), "archive_s": archive,
        "archive_engine_s": resources.get("pack_engine_seconds", 0.0), "archive_tools_s": resources.get("pack_tool_seconds"),
        "archive_tools_engine_s": resources.get("pack_tool_engine_seconds"),
        **{f"{k}_s": v for k, v in kinds.items()},
        "bookkeeping_s": round(sum(kinds.values()), 3),
        "other_s": round(wall - target - capture - startup - archive - sum(kinds.values()), 3),
        "steps": steps,
    }


def run_polygraphy(case: dict, work: str, kind: str) -> dict:
    """polygraphy's documented workflow on the case's model and feeds (bench_shrink.py's)."""
    import bench_shrink

    os.makedirs(work, exist_ok=True)
    spec = {"path": case["model"], "target": case["target"], "tol": case.get("tol"), "step_timeout": 1800}
    row = bench_shrink.run_polygraphy(spec, {"npz": case["inputs"], "kind": kind}, work)
    return {k: row.get(k) for k in ("wall_s", "calls", "nodes_built", "start_nodes", "minimal_nodes", "error",
                                    "step_s", "peak_mib")}


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def table(rows: list[dict]) -> str:
    head = ("| case | target | nodes → minimal | calls | wall s | target calls s | reference s | **own s (share)** "
            "| extraction s | pack s | write s | compare s | bookkeeping s (share) | capture s | start-up s "
            "| archive s | archive: check's engines s, waiting on repro.py + polygraphy s (of it engine runs s) | other s "
            "| polygraphy: wall s, calls, nodes |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | | | | | | | {r['error']} | | | | | | |")
            continue
        w = r["wall_s"]
        nodes = f"{r['file_nodes']} (folded {r['nodes']})" if r.get("file_nodes") else f"{r['nodes']}"
        poly = r.get("polygraphy")
        poly_text = ("" if not poly else poly.get("error") or
                     f"{poly['wall_s']:.1f}, {poly.get('calls')}, {poly.get('start_nodes')} → {poly.get('minimal_nodes')}")
        lines.append(
            f"| {r['name']} | {r['target']} | {nodes} → {r['minimal_nodes']} ({r['status']}) | {r['calls']} "
            f"| {w:.1f} | {r['target_s']:.1f} ({pct(r['target_s'], w)}) | {r['reference_s']:.1f} "
            f"| **{r['own_s']:.1f} ({pct(r['own_s'], w)})** "
            + " ".join(f"| {r[k + '_s']:.2f} ({pct(r[k + '_s'], w)})" for k in KINDS)
            + f" | **{r['bookkeeping_s']:.1f} ({pct(r['bookkeeping_s'], w)})** "
            + " ".join(f"| {r[k]:.1f} ({pct(r[k], w)})" for k in ("capture_s", "startup_s", "archive_s"))
            + f" | {_archive_split(r)} | {r['other_s']:.1f} ({pct(r['other_s'], w)})"
            + f" | {poly_text} |")
    return "\n".join(lines)


def _archive_split(row: dict) -> str:
    """The archive step's check (engine seconds, not "own") and its wait for the bundled
    repro.py's and polygraphy's processes, with the engine seconds they recorded inside that
    wait (not "own"; the rest of the wait is); "-" for a tree that did not record it."""
    tools, engine = row.get("archive_tools_s"), row.get("archive_tools_engine_s")
    return (f"{row.get('archive_engine_s') or 0.0:.1f}, " + ("-" if tools is None else f"{tools:.1f}")
            + ("" if engine is None else f" ({engine:.1f})"))


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
    parser.add_argument("--polygraphy", action="store_true",
                        help="run polygraphy's debug reduce workflow on each case too (bench_shrink.py's)")
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
        rows: list[dict] = []

        def write() -> str:  # after every row: a long case cut short keeps the rows before it
            text = table(rows)
            if args.md:
                with open(args.md, "w") as handle:
                    handle.write(text + "\n")
            if args.json:
                with open(args.json, "w") as handle:
                    json.dump({"rows": rows, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "baseline": args.baseline,
                               "load_average": os.getloadavg()}, handle, indent=1)
            return text

        for number, case in enumerate(chosen):
            print(f"[{number + 1}/{len(chosen)}] {case['name']} …", file=sys.stderr, flush=True)
            if args.baseline:
                os.makedirs(os.path.join(root, f"base{number}"))
                rows.append(run_case(case, os.path.join(root, f"base{number}"), args.baseline))
                write()
            work = os.path.join(root, f"case{number}")
            os.makedirs(work)
            rows.append(run_case(case, work))
            write()
            if args.polygraphy:
                rows[-1]["polygraphy"] = run_polygraphy(case, os.path.join(root, f"poly{number}"),
                                                        rows[-1].get("signature") or "mismatch")
                write()
        print(write())
    finally:
        if args.keep:
            print(f"work directories kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
