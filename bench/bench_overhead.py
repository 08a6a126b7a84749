"""Where each tool's own time goes on small pass/fail rows: ``reprokit shrink --target cmd:…`` vs
``polygraphy debug reduce --check …`` (issue 39; a table, not a test).

    python bench/bench_overhead.py                       # 3 toy rows, 3 runs of each tool
    python bench/bench_overhead.py --runs 5 --baseline ba9416b   # + reprokit as of that commit

The check command of both tools is wrapped by a shell script that logs when it started and ended
(``date``, a millisecond's cost), so a run's wall splits into the **check's own seconds** (the
user's: every call from its start to its end) and the **tool's own** (the rest), and the tool's
own into: *start* (the tool's process started → the first check call: interpreter, imports, loading
the model, reference capture where it comes first), *between* (the gaps between calls: writing the
candidate, spawning the check, reading its output, judging, journal and summary writes) and *end*
(the last call ended → the process exited: final writes, worker shutdown, the interpreter's
teardown). Each cell is the median of ``--runs`` runs; the rows are bench/bench_passfail.py's.
``--baseline REV`` adds reprokit as of that git revision (exported to a temporary folder and compiled
to bytecode like this checkout, run with PYTHONPATH there): before and after.

Writes ``bench/results/overhead.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import planted  # noqa: E402
from bench_passfail import POLYGRAPHY, REPROKIT, compile_bytecode  # noqa: E402

N = "onnx_graphsurgeon_node_{}".format

# Logs "<start> <end>" (epoch seconds) per call; exits with the check's status.
TIMED = """#!/bin/sh
log=$1; shift
started=$(date +%s.%N)
"$@"
code=$?
echo "$started $(date +%s.%N)" >> "$log"
exit $code
"""


def rows(work: str) -> list[dict]:
    checker = planted.write_checker(work, "fake_reduce_checker.py", planted.FAKE_REDUCE_CHECKER)
    red = planted.save(*planted.reducable(), work, "reducable")
    const = planted.save(*planted.reducable_with_const(), work, "reducable_with_const")
    check = [sys.executable, checker, "{model}", "--fail-node"]
    return [
        {"name": "reducable fail [1]", "model": red, "check": [*check, N(1)]},
        {"name": "with_constant fail [3]", "model": const, "check": [*check, N(3)]},
        {
            "name": "--no-reduce-inputs, node 5",
            "model": red,
            "check": [*check, N(5)],
            "flags": ["--no-reduce-inputs"],
            "polygraphy_flags": ["--no-reduce-inputs"],
        },
    ]


def _split(started: float, ended: float, log: str) -> dict:
    """The run's wall split into the check's own seconds and the tool's: start, between, end."""
    with open(log) as handle:
        calls = [tuple(map(float, line.split())) for line in handle if line.strip()]
    calls.sort()
    wall = ended - started
    check = sum(b - a for a, b in calls)
    if not calls:
        return {
            "wall": wall,
            "calls": 0,
            "check": 0.0,
            "ours": wall,
            "start": wall,
            "between": 0.0,
            "end": 0.0,
        }
    between = sum(max(0.0, calls[i][0] - calls[i - 1][1]) for i in range(1, len(calls)))
    return {
        "wall": wall,
        "calls": len(calls),
        "check": check,
        "ours": wall - check,
        "start": calls[0][0] - started,
        "between": between,
        "end": ended - calls[-1][1],
    }


def run_reprokit(row: dict, work: str, timed: str, pythonpath: str | None) -> dict:
    import shlex

    log = os.path.join(work, "calls.log")
    open(log, "w").close()
    command = shlex.join(["sh", timed, log, *row["check"]])
    cmd = [
        REPROKIT,
        "shrink",
        row["model"][0],
        "--target",
        f"cmd:{command}",
        "-o",
        os.path.join(work, "out"),
        "--no-pack",
        "--json",
        "--inputs",
        row["model"][1],
        *row.get("flags", []),
    ]
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    started = time.time()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900, env=env)
    found = _split(started, time.time(), log)
    found["rc"] = proc.returncode
    if proc.returncode == 0:
        summary = json.loads(proc.stdout)
        found["summary_wall"] = summary["wall_s"]
        found["steps"] = {s["step"]: s["seconds"] for s in summary["steps"]}
    return found


def run_polygraphy(row: dict, work: str, timed: str) -> dict:
    import numpy as np
    from polygraphy.json import save_json

    log = os.path.join(work, "calls.log")
    open(log, "w").close()
    with np.load(row["model"][1]) as data:
        save_json([{k: np.array(data[k]) for k in data.files}], os.path.join(work, "inputs.json"))
    check = [a.replace("{model}", "polygraphy_debug.onnx") for a in row["check"]]
    cmd = [
        POLYGRAPHY,
        "debug",
        "reduce",
        row["model"][0],
        "-o",
        "reduced.onnx",
        "--mode=bisect",
        "--load-inputs",
        "inputs.json",
        *row.get("polygraphy_flags", []),
        "--check",
        "sh",
        timed,
        log,
        *check,
    ]
    started = time.time()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    found = _split(started, time.time(), log)
    found["rc"] = proc.returncode
    return found


def export(rev: str, folder: str) -> str:
    """reprokit's package and templates as of ``rev``, in ``folder``, compiled to bytecode."""
    import compileall

    os.makedirs(folder)
    tar = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "reprokit", "templates"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=tar, check=True)
    compileall.compile_dir(os.path.join(folder, "reprokit"), quiet=1)
    return folder


KEYS = ("wall", "check", "ours", "start", "between", "end")


def median_of(runs: list[dict]) -> dict:
    got = {k: statistics.median(r[k] for r in runs) for k in KEYS}
    got["calls"] = statistics.median(r["calls"] for r in runs)
    got["rc"] = sorted({r["rc"] for r in runs})
    if all("summary_wall" in r for r in runs):  # summary.json's wall_s against the process's wall
        got["summary_short"] = statistics.median(r["wall"] - r["summary_wall"] for r in runs)
    return got


def render(results: list[dict], tools: list[str], runs: int) -> str:
    header = [
        "row",
        "tool",
        "calls",
        "wall s",
        "check's own s",
        "tool's own s",
        "start s",
        "between s",
        "per call s",
        "end s",
        "own / polygraphy's own",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    totals = {t: dict.fromkeys(KEYS, 0.0) for t in tools}
    for res in results:
        pg_own = res["polygraphy"]["ours"]
        for tool in tools:
            m = res[tool]
            for k in KEYS:
                totals[tool][k] += m[k]
            per_call = m["between"] / max(1, m["calls"] - 1)
            lines.append(
                "| "
                + " | ".join(
                    [
                        res["name"],
                        tool + ("" if m["rc"] == [0] else f" (exit {m['rc']})"),
                        f"{m['calls']:g}",
                        f"{m['wall']:.2f}",
                        f"{m['check']:.2f}",
                        f"{m['ours']:.2f}",
                        f"{m['start']:.2f}",
                        f"{m['between']:.2f}",
                        f"{per_call:.3f}",
                        f"{m['end']:.2f}",
                        f"{m['ours'] / max(1e-9, pg_own):.2f}×",
                    ]
                )
                + " |"
            )
    for tool in tools:
        t = totals[tool]
        lines.append(
            "| **total** | "
            + " | ".join(
                [
                    tool,
                    "",
                    f"{t['wall']:.2f}",
                    f"{t['check']:.2f}",
                    f"{t['ours']:.2f}",
                    f"{t['start']:.2f}",
                    f"{t['between']:.2f}",
                    "",
                    f"{t['end']:.2f}",
                    f"{t['ours'] / max(1e-9, totals['polygraphy']['ours']):.2f}×",
                ]
            )
            + " |"
        )
    short = [
        f"{res['name']} {res[t]['summary_short']:+.3f} s ({t})"
        for res in results
        for t in tools
        if "summary_short" in res[t]
    ]
    lines += [
        "",
        f"Medians of {runs} runs per cell. *check's own*: the check command's seconds, start to end "
        "(the user's); *tool's own*: wall minus those — *start* (process start → first call), *between* "
        "(the gaps between calls; *per call*: their mean), *end* (last call → process exit). "
        "Process wall minus summary.json's wall_s: " + ("; ".join(short) or "–") + ".",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--baseline", metavar="REV", help="also run reprokit as of this git revision"
    )
    parser.add_argument(
        "--render", metavar="JSON", help="only print the table of an earlier results JSON"
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as handle:
            payload = json.load(handle)
        print(render(payload["rows"], payload["tools"], payload["runs"]))
        return 0
    compile_bytecode()
    tools = ["reprokit", "polygraphy"] + ([f"reprokit {args.baseline}"] if args.baseline else [])
    root = tempfile.mkdtemp(prefix="bench-overhead-")
    results = []
    try:
        baseline = export(args.baseline, os.path.join(root, "baseline")) if args.baseline else None
        timed = os.path.join(root, "timed.sh")
        with open(timed, "w") as handle:
            handle.write(TIMED)
        for number, row in enumerate(rows(root)):
            runs: dict[str, list[dict]] = {t: [] for t in tools}
            for attempt in range(args.runs):
                for (
                    tool
                ) in tools:  # interleaved: a load that comes and goes falls on every tool alike
                    work = os.path.join(root, f"{number}-{attempt}-{tools.index(tool)}")
                    os.makedirs(work)
                    if tool == "polygraphy":
                        runs[tool].append(run_polygraphy(row, work, timed))
                    else:
                        runs[tool].append(
                            run_reprokit(row, work, timed, None if tool == "reprokit" else baseline)
                        )
            res = {"name": row["name"], **{t: median_of(r) for t, r in runs.items()}, "raw": runs}
            print(
                f"{row['name']}: "
                + ", ".join(
                    f"{t} own {res[t]['ours']:.2f} s of {res[t]['wall']:.2f}" for t in tools
                ),
                file=sys.stderr,
                flush=True,
            )
            results.append(res)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = render(results, tools, args.runs)
    print(text)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    with open(os.path.join(BENCH, "results", "overhead.md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(BENCH, "results", "overhead.json"), "w") as handle:
        json.dump({"rows": results, "tools": tools, "runs": args.runs}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
