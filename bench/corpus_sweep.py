"""Sweep reprokit over every model of the ONNX backend test data; count exit codes per target.

    python bench/corpus_sweep.py [--suites simple,pytorch-operator,pytorch-converted,light,node]
                                 [--targets emulate:fp16,emulate:bf16,openvino:f32,ort:opt]
                                 [--node-per-op 0] [--sample N] [--jobs 2] [--timeout 300]
                                 [--no-shrink] [--json FILE]

Every model of the test data shipped in the installed onnx wheel (``backend/test/data/simple``,
``pytorch-operator``, ``pytorch-converted``, ``light``; ``node`` is regenerated from onnx's own
generators as in ``node_corpus_sweep.py``, whose writer and sampler this reuses) goes through
``reprokit check`` under every target, fed with the test's own ``test_data_set_0`` (``light``
models ship none: seeded random feeds). Every check that diverges (exit 1) then goes through
``shrink`` → ``verify`` (the archive shrink wrote; exit 1 = it reproduces) → ``audit``.
Prints a table of exit codes per command and target and every internal error (exit 70, always
reprokit's bug). ``--sample N`` checks a deterministic slice of N models (the CI test runs one).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_corpus_sweep import regenerate, sample  # noqa: E402

SHIPPED = ("simple", "pytorch-operator", "pytorch-converted", "light")
SUITES = SHIPPED + ("node",)
TARGETS = ("emulate:fp16", "emulate:bf16", "openvino:f32", "ort:opt")


def data_root() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def collect(suites, node_dir: str, node_per_op: int) -> list[dict]:
    """Every model of the chosen suites: {"suite", "name", "model", "inputs" (a folder or None)}."""
    found = []
    for suite in suites:
        if suite == "node":
            tests = regenerate(node_dir)
            if node_per_op:
                tests = sample(tests, node_per_op)
            found += [{"suite": "node", "name": name, "model": os.path.join(folder, "model.onnx"),
                       "inputs": os.path.join(folder, "test_data_set_0")} for name, _, folder in tests]
            continue
        root = os.path.join(data_root(), suite)
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            if entry.endswith(".onnx"):  # light/: a bare model, no test data
                found.append({"suite": suite, "name": entry[:-5], "model": path, "inputs": None})
            elif os.path.isfile(os.path.join(path, "model.onnx")):
                data = os.path.join(path, "test_data_set_0")
                found.append({"suite": suite, "name": entry, "model": os.path.join(path, "model.onnx"),
                              "inputs": data if os.path.isdir(data) else None})
    return found


def pick(models: list[dict], count: int) -> list[dict]:
    """A deterministic slice: the ``count`` models first by a hash of their name."""
    ranked = sorted(models, key=lambda m: hashlib.sha256(f"{m['suite']}/{m['name']}".encode()).hexdigest())
    return sorted(ranked[:count], key=lambda m: (m["suite"], m["name"]))


def reprokit(args: list[str], timeout: float) -> dict:
    """One reprokit command: its exit code, its ``Error:`` line and its stdout (``--json``)."""
    argv = [sys.executable, "-m", "reprokit", *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "what": f"no answer within {timeout:g} s", "stdout": ""}
    what = next((line for line in proc.stderr.splitlines() if line.startswith("Error: ")), "")
    return {"exit": proc.returncode, "what": what, "stdout": proc.stdout}


def feeds(model: dict) -> list[str]:
    return ["--inputs", model["inputs"]] if model["inputs"] else ["--seed", "0"]


def check(model: dict, target: str, timeout: float) -> dict:
    result = reprokit(["check", model["model"], "--target", target, *feeds(model), "--json"], timeout)
    if result["exit"] in (0, 1):
        try:
            payload = json.loads(result["stdout"])
            signature = payload["verdict"]["signature"]
            result["what"] = signature["kind"] + (f" ({signature['detail']})" if signature["detail"] else "")
            if payload.get("warnings"):
                result["warnings"] = payload["warnings"]
        except (ValueError, KeyError):
            result["what"] = "unreadable --json output"
    return result


def follow_up(model: dict, target: str, work: str, timeout: float) -> dict:
    """shrink → verify → audit on a model that diverges: each step's exit and Error: line."""
    out = os.path.join(work, "shrink")
    steps = {"shrink": reprokit(["shrink", model["model"], "--target", target, *feeds(model), "-o", out,
                                 "--json"], timeout)}
    archive = os.path.join(out, "report.tar.gz")
    if os.path.isfile(archive):
        steps["verify"] = reprokit(["verify", archive, "--json"], timeout)
    steps["audit"] = reprokit(["audit", model["model"], "--target", target, *feeds(model), "-o",
                               os.path.join(work, "audit"), "--json"], timeout)
    return {name: {"exit": r["exit"], "what": r["what"]} for name, r in steps.items()}


def sweep(models: list[dict], targets, *, jobs: int, timeout: float, shrink: bool,
          progress=None) -> list[dict]:
    """Every (model, target): the check and, where it diverges, shrink → verify → audit."""
    jobs_list = [(m, t) for m in models for t in targets]
    done = collections.Counter()

    def run(job):
        model, target = job
        row = {"suite": model["suite"], "test": model["name"], "target": target}
        row["check"] = check(model, target, timeout)
        row["check"].pop("stdout", None)
        if shrink and row["check"]["exit"] == 1:
            with tempfile.TemporaryDirectory(prefix="corpus-sweep-") as work:
                row.update(follow_up(model, target, work, timeout))
        done["n"] += 1
        if progress and (done["n"] % 25 == 0 or done["n"] == len(jobs_list)):
            progress(f"  {done['n']}/{len(jobs_list)} done")
        return row

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(run, jobs_list))


def table(rows: list[dict], targets, command: str) -> list[str]:
    """Markdown rows: exit codes of ``command`` per target."""
    counts = {t: collections.Counter(str(r[command]["exit"]) for r in rows if r["target"] == t and command in r)
              for t in targets}
    codes = sorted({c for counter in counts.values() for c in counter}, key=lambda c: (not c.isdigit(), c.zfill(4)))
    lines = [f"| {command} | " + " | ".join(f"exit {c}" for c in codes) + " |", "| --- |" + " --- |" * len(codes)]
    lines += [f"| {t} | " + " | ".join(str(counts[t].get(c, 0)) for c in codes) + " |" for t in targets]
    return lines


def internal_errors(rows: list[dict]) -> list[str]:
    return [f"{r['target']:<14} {command:<6} {r['suite']}/{r['test']}: {r[command]['what']}"
            for r in rows for command in ("check", "shrink", "verify", "audit")
            if command in r and r[command]["exit"] == 70]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--node-per-op", type=int, default=0, help="node tests per operator (0: every one)")
    parser.add_argument("--node-dir", help="where to regenerate the node tests (default: a temporary directory)")
    parser.add_argument("--sample", type=int, default=0, help="a deterministic slice of N models (0: all)")
    parser.add_argument("--jobs", type=int, default=2, help="models run at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per reprokit command")
    parser.add_argument("--no-shrink", action="store_true", help="check only")
    parser.add_argument("--details", action="store_true", help="list every non-zero exit too")
    parser.add_argument("--json", dest="json_path", help="also write all results to this file")
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    with tempfile.TemporaryDirectory(prefix="corpus-") as node_dir:
        models = collect(args.suites.split(","), args.node_dir or node_dir, args.node_per_op)
        if args.sample:
            models = pick(models, args.sample)
        print(f"{len(models)} models × {len(targets)} targets", flush=True)
        rows = sweep(models, targets, jobs=args.jobs, timeout=args.timeout, shrink=not args.no_shrink,
                     progress=lambda text: print(text, file=sys.stderr, flush=True))
    for command in ("check", "shrink", "verify", "audit"):
        if any(command in r for r in rows):
            print("\n".join(table(rows, targets, command)) + "\n")
    errors = internal_errors(rows)
    print(f"exit 70 (internal errors): {len(errors)}")
    print("\n".join(f"  {line}" for line in errors))
    warned = sum(1 for r in rows if r["check"].get("warnings"))
    print(f"checks with a degenerate-reference warning: {warned}")
    if args.details:
        print("\nevery non-zero exit:")
        for r in rows:
            for command in ("check", "shrink", "verify", "audit"):
                if command in r and r[command]["exit"] not in (0, 70) and not (command in ("check", "verify")
                                                                               and r[command]["exit"] == 1):
                    print(f"  {command:<6} exit {r[command]['exit']!s:<7} {r['target']:<14} "
                          f"{r['suite']}/{r['test']}: {r[command]['what']}")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
