"""Side by side on pass/fail checks: ``reprokit shrink --target cmd:…`` vs ``polygraphy debug reduce
--check …`` (a table, not a test).

    python bench/bench_passfail.py            # every scenario (~42 min on a shared 2-core machine)
    python bench/bench_passfail.py --only reducable
    python bench/bench_passfail.py --flaky-only --flaky-runs 30 --flaky-tools reprokit

reprokit's modules are compiled to bytecode first (``compile_bytecode``), as pip compiles an
installed package's (polygraphy's were). Both tools get the same check command, wrapped by ``bench/count_check.py``, which logs every call
and the node count of the model it judged: "calls" and "nodes built" are counted the same way for
both, from that log. No ``--fail-regex`` for either (as polygraphy's own tests run): the exit
status is the verdict.

Scenarios (models and checkers from ``bench/planted.py``):
- polygraphy's reducable cases: isolate node 1/3/5/7/9, required branches [1,3] and [7,9], the
  constant-only model (node 3) and the multi-output Split;
- a Conv→Clip fusion failure that vanishes when the Conv output is marked, in the 69-node CNN sample,
  once with a message naming the two nodes and once with a check that only fails;
- a TensorRT-parser-like message naming a Unique node in a 120-node chain;
- OpenVINO refusing a Det node in a 120-node chain (a real engine; the check is bench/oracle_check.py);
- polygraphy's options, each tool with its own spelling: a custom return code (``--fail-code 5``),
  a failure that exits 0 and says so (two ``--fail-regex``), ``--no-reduce-inputs``,
  ``--no-reduce-outputs``, float64 feeds for a float32 model, a check that always fails;
- a 50% flaky check, 10 runs of each tool: how often each ends with success (exit 0).

reprokit replays a pass/fail ``cmd`` check by default on the result, never on the original (issue 39:
the original once, then the pack calibration and the result twice afresh, or the result three
times: 4 calls outside the search, docs/algorithms.md step 8); the column "reprokit --replays 0"
is the search alone, for a check known to be deterministic. Issue 39's realistic rows come from
``bench/hf_passfail.py`` (transformers exports, cached under bench/.cache).

Writes ``bench/results/passfail.{md,json}``.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import cost_split  # noqa: E402  (fixed vs search, the floor)
import planted  # noqa: E402
from count_check import model_work, read_log  # noqa: E402

BIN = os.path.dirname(sys.executable)
REPROKIT = os.path.join(BIN, "reprokit")
POLYGRAPHY = os.path.join(BIN, "polygraphy")
COUNT = [sys.executable, os.path.join(BENCH, "count_check.py")]
N = "onnx_graphsurgeon_node_{}".format


def scenarios(work: str) -> list[dict]:
    checker = planted.write_checker(work, "fake_reduce_checker.py", planted.FAKE_REDUCE_CHECKER)
    fusion = planted.write_checker(work, "fusion_checker.py", planted.FUSION_CHECKER)
    silent = planted.write_checker(work, "silent_fusion_checker.py", planted.SILENT_FUSION_CHECKER)
    parser = planted.write_checker(work, "parser_checker.py", planted.PARSER_CHECKER)
    red = planted.save(*planted.reducable(), work, "reducable")
    const = planted.save(*planted.reducable_with_const(), work, "reducable_with_const")
    multi = planted.save(*planted.multi_output(), work, "multi_output")
    unique = planted.save(*planted.with_named_op("Unique"), work, "unique120")
    det = planted.save(*planted.with_named_op("Det"), work, "det120")
    conv_clip = (os.path.join(ROOT, "samples", "conv_clip.onnx"), os.path.join(ROOT, "samples", "conv_clip.inputs.npz"))
    out = []
    import numpy as np

    f64 = os.path.join(work, "reducable.f64.npz")
    np.savez(f64, X0=np.array([1.1]), Y0=np.array([2.0]))
    for nodes, expect in [([1], [1]), ([3], [3]), ([5], [5]), ([7], [7]), ([9], [9]), ([1, 3], [1, 3]),
                          ([7, 9], [7, 9])]:
        out.append({"name": f"reducable fail {nodes}", "model": red, "expect": [N(i) for i in expect],
                    "check": [sys.executable, checker, "{model}", "--fail-node", *[N(i) for i in nodes]]})
    out.append({"name": "with_constant fail [3]", "model": const, "expect": [N(3)],
                "check": [sys.executable, checker, "{model}", "--fail-node", N(3)]})
    out.append({"name": "multi_output fail [Split]", "model": multi, "expect": [N(3)],
                "check": [sys.executable, checker, "{model}", "--fail-node", N(3)]})
    out.append({"name": "conv_clip fusion (69 nodes)", "model": conv_clip, "expect": None,
                "check": [sys.executable, fusion, "{model}"]})
    out.append({"name": "conv_clip fusion, silent check (69 nodes)", "model": conv_clip, "expect": None,
                "check": [sys.executable, silent, "{model}"]})
    # issue 25's own cases, unseen by the reduction code's tests: two distant nodes that fail only
    # together (a check naming neither), and a Conv→Clip fusion deep in a 144-node CNN
    chain160 = planted.save(*planted.with_named_op("Abs", 160), work, "chain160")
    out.append({"name": "pair of distant nodes, silent (160 nodes)", "model": chain160, "expect": ["n23", "n121"],
                "check": [sys.executable, checker, "{model}", "--fail-node", "n23", "n121"]})
    cnn = planted.save(*planted.cnn_with_one_clip(), work, "cnn_clip")
    out.append({"name": "Conv→Clip fusion, silent check (144 nodes)", "model": cnn,
                "expect": ["fused/conv", "fused/clip"], "check": [sys.executable, silent, "{model}"]})
    out.append({"name": "parser names Unique (120 nodes)", "model": unique, "expect": ["suspect"],
                "check": [sys.executable, parser, "{model}"]})
    golden = os.path.join(work, "det_golden.npz")
    # reprokit feeds each candidate's cut tensors through {inputs}; polygraphy's candidates read
    # the original feeds (it folds what it cuts); the golden file holds every tensor's reference.
    out.append({"name": "OpenVINO refuses Det (120 nodes)", "model": det, "expect": ["suspect"], "golden": golden,
                "check": [sys.executable, os.path.join(BENCH, "oracle_check.py"), "{model}", golden, "{inputs}",
                          "--target", "openvino:f32"], "polygraphy_inputs": det[1]})
    fail = [sys.executable, checker, "{model}", "--fail-node"]
    out += [
        {"name": "custom return code 5, node 5", "model": red, "expect": [N(5)],
         "check": [*fail, N(5), "--default-return-code", "5"], "flags": ["--fail-code", "5"],
         "polygraphy_flags": ["--fail-code", "5"]},
        {"name": "fails by exit 0 + message, node 7", "model": red, "expect": [N(7)],
         "check": [*fail, N(7), "--default-return-code", "0"],
         "flags": ["--fail-regex", "REALLY BAD", "--fail-regex", "FOUND A BAD NODE"],
         "polygraphy_flags": ["--fail-regex", "REALLY BAD", "FOUND A BAD NODE"]},
        {"name": "--no-reduce-inputs, node 5", "model": red, "expect": [N(1), N(3), N(5)],
         "check": [*fail, N(5)], "flags": ["--no-reduce-inputs"], "polygraphy_flags": ["--no-reduce-inputs"]},
        {"name": "--no-reduce-outputs, node 7", "model": red, "expect": [N(7), N(9)],
         "check": [*fail, N(7)], "flags": ["--no-reduce-outputs"], "polygraphy_flags": ["--no-reduce-outputs"]},
        {"name": "float64 feeds, node 3", "model": (red[0], f64), "expect": [N(3)], "check": [*fail, N(3)]},
        {"name": "check always fails (with_constant)", "model": const, "expect": "one node",
         "check": [sys.executable, checker, "{model}"]},
    ]
    return out + realistic(work)


def realistic(work: str) -> list[dict]:
    """Issue 39's rows of realistic size (bench/hf_passfail.py: transformers exports, cached)."""
    try:
        import hf_passfail
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"realistic rows skipped: {exc} (pip install -e .[bench])", file=sys.stderr)
        return []
    return hf_passfail.scenarios(work, sys.executable, planted.write_checker)


FLAKY_CHECK = """import random, sys
if random.random() < 0.5:
    print("FLAKY FAILURE")
    sys.exit(1)
"""


def flaky_runs(root: str, runs: int, tools=("reprokit", "polygraphy")) -> dict:
    """A check that fails half the time whatever the model: how often does each tool end in
    success, and how often does reprokit say "flaky" (exit 6 on the original, 7 on the result)?"""
    checker = planted.write_checker(root, "flaky_check.py", FLAKY_CHECK)
    red = planted.save(*planted.reducable(), root, "flaky_reducable")
    case = {"model": red, "check": [sys.executable, checker, "{model}"]}
    found = {"runs": runs}
    for tool, run in (("reprokit", run_reprokit), ("polygraphy", run_polygraphy)):
        if tool not in tools:
            continue
        codes, flaky, calls = [], 0, []
        for attempt in range(runs):
            work = os.path.join(root, f"flaky-{tool}-{attempt}")
            os.makedirs(work)
            row = run(case, work)
            codes.append(row["rc"])
            calls.append(row["calls"])
            flaky += row["rc"] in (6, 7) and "is flaky" in row.get("error", "")
            print(f"flaky check, {tool} run {attempt + 1}: exit {row['rc']}, {row['calls']} calls "
                  f"{row.get('error', '')[:120]}", file=sys.stderr, flush=True)
        found[tool] = {"exit_0": codes.count(0), "codes": codes, "said_flaky": flaky, "calls": calls}
    return found


def _calls(log: str) -> dict:
    """calls, nodes built, heavy layers built and the calls of light layers only (and their nodes:
    buildcost.ESTIMATE prices them apart) from bench/count_check.py's log; the heavy counts None
    where the log holds none."""
    calls = read_log(log)
    known = all(h is not None for _, h in calls)
    light = [n for n, h in calls if h == 0]
    return {"calls": len(calls), "nodes_built": sum(n for n, _ in calls),
            "heavy_built": sum(h for _, h in calls) if known else None,
            "light_calls": len(light) if known else None, "light_nodes": sum(light) if known else None}


def _names(path: str) -> list[str]:
    import onnx

    return sorted(n.name for n in onnx.load(path, load_external_data=False).graph.node)


def run_reprokit(case: dict, work: str, *extra: str) -> dict:
    import shlex

    log = os.path.join(work, "calls.log")
    open(log, "w").close()
    command = shlex.join([*COUNT, log, *case["check"]])
    out = os.path.join(work, "out")
    cmd = [REPROKIT, "shrink", case["model"][0], "--target", f"cmd:{command}", "-o", out, "--no-pack", "--json",
           *case.get("flags", []), *extra]
    if os.path.exists(case["model"][1]):
        cmd += ["--inputs", case["model"][1]]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    row = {"tool": "reprokit", "rc": proc.returncode, "wall_s": time.monotonic() - started}
    row.update(_calls(log))
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[0][:200]
        return row
    summary = json.loads(proc.stdout)
    row.update(nodes=summary["minimal"]["node_names"], one_minimal=summary["one_minimal"],
               counted=summary["calls"]["target"],
               steps={s["step"]: s["calls"] for s in summary["steps"] if s["calls"]},
               # what each step built and the original's copies riding in packs: the fixed vs search split
               step_work=[{k: s.get(k, 0) for k in ("step", "calls", "heavy_built", "light_calls", "light_nodes")}
                          for s in summary["steps"] if s["calls"] and "light_calls" in s],
               by_kind=summary["build_work"].get("by_kind"), start_nodes=summary["original"]["nodes"],
               model_work=model_work(case["model"][0]), result_work=model_work(os.path.join(out, "minimal.onnx")))
    return row


def run_polygraphy(case: dict, work: str) -> dict:
    log = os.path.join(work, "calls.log")
    open(log, "w").close()
    check = [a.replace("{model}", "polygraphy_debug.onnx").replace("{inputs}", case.get("polygraphy_inputs", ""))
             for a in case["check"]]
    cmd = [POLYGRAPHY, "debug", "reduce", case["model"][0], "-o", "reduced.onnx", "--mode=bisect"]
    if os.path.exists(case["model"][1]):
        import numpy as np
        from polygraphy.json import save_json


        with np.load(case["model"][1]) as data:
            save_json([{k: np.array(data[k]) for k in data.files}], os.path.join(work, "inputs.json"))
        cmd += ["--load-inputs", "inputs.json"]
    cmd += [*case.get("polygraphy_flags", []), "--check", *COUNT, log, *check]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    row = {"tool": "polygraphy", "rc": proc.returncode, "wall_s": time.monotonic() - started}
    row.update(_calls(log))
    reduced = os.path.join(work, "reduced.onnx")
    if proc.returncode != 0 or not os.path.exists(reduced):
        row["error"] = ([line for line in (proc.stdout + proc.stderr).splitlines() if "[E]" in line or "Error" in line]
                        or ["no reduced.onnx"])[-1][:200]
        return row
    row["nodes"] = _names(reduced)
    return row


def _golden(case: dict, work: str) -> None:
    """Reference outputs for oracle_check (ORT fp32 on the original, every tensor marked)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    model = onnx.load(case["model"][0])
    names = [o for n in model.graph.node for o in n.output]
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with np.load(case["model"][1]) as data:
        feeds = {k: data[k] for k in data.files}
    np.savez(case["golden"], **dict(zip(names, session.run(names, feeds))))


def compile_bytecode() -> None:
    """Compile reprokit's modules to bytecode before anything is timed, as ``pip install`` does
    for a wheel (and did for polygraphy's): where the environment sets PYTHONDONTWRITEBYTECODE
    (this machine does) a source checkout is otherwise compiled again, all ~140 modules, at every
    start of every process (the CLI, and a worker's interpreter), 0.2-0.5 s each on the shared
    2-core machine — a cost of the checkout, not of the tool."""
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "reprokit"), quiet=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--flaky-runs", type=int, default=10, help="runs of each tool on the flaky check (0: skip)")
    parser.add_argument("--flaky-only", action="store_true", help="only the flaky check (--flaky-runs runs)")
    parser.add_argument("--flaky-tools", default="reprokit,polygraphy", help="tools run on the flaky check")
    parser.add_argument("--render", metavar="JSON", help="only print the table of an earlier results JSON")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as handle:
            payload = json.load(handle)
        print(render(payload["scenarios"], payload.get("wall_s"), payload.get("flaky")))
        return 0
    compile_bytecode()
    if args.flaky_only:
        return _flaky_only(args)
    root = tempfile.mkdtemp(prefix="bench-passfail-")
    results = []
    started = time.monotonic()
    try:
        for number, case in enumerate(scenarios(root)):
            if args.only and not any(o in case["name"] for o in args.only):
                continue
            if case.get("golden"):
                _golden(case, root)
            res = {"name": case["name"], "expect": case["expect"]}
            for tool, run in (("reprokit", run_reprokit), ("polygraphy", run_polygraphy),
                              ("reprokit_replays0", lambda c, w: run_reprokit(c, w, "--replays", "0"))):
                work = os.path.join(root, f"{number}-{tool}")
                os.makedirs(work)
                res[tool] = run(case, work)
            print(f"{case['name']}: reprokit {res['reprokit'].get('calls')} calls → {res['reprokit'].get('nodes')}; "
                  f"polygraphy {res['polygraphy'].get('calls')} calls → {res['polygraphy'].get('nodes')}",
                  file=sys.stderr, flush=True)
            results.append(res)
        flaky = flaky_runs(root, args.flaky_runs) if args.flaky_runs and not args.only else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = render(results, time.monotonic() - started, flaky)
    print(text)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    stem = "passfail.partial" if args.only else "passfail"
    with open(os.path.join(BENCH, "results", stem + ".md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(BENCH, "results", stem + ".json"), "w") as handle:
        json.dump({"scenarios": results, "flaky": flaky, "wall_s": time.monotonic() - started}, handle, indent=1)
    return 0


def _flaky_only(args) -> int:
    """The flaky check alone: its line of the table, written to bench/results/passfail.flaky.md."""
    root = tempfile.mkdtemp(prefix="bench-passfail-")
    started = time.monotonic()
    try:
        flaky = flaky_runs(root, args.flaky_runs, tuple(args.flaky_tools.split(",")))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = "\n".join(_flaky_lines(flaky) + [f"{time.monotonic() - started:.0f} s in all."])
    print(text)
    with open(os.path.join(BENCH, "results", "passfail.flaky.md"), "w") as handle:
        handle.write(text + "\n")
    return 0


def _flaky_lines(flaky: dict) -> list[str]:
    lines = [f"A check that fails half the time whatever the model, {flaky['runs']} runs of each tool:"]
    if "reprokit" in flaky:
        rk = flaky["reprokit"]
        lines.append(f"- reprokit ended in success (exit 0) {rk['exit_0']} times, said \"flaky\" {rk['said_flaky']} "
                     f"times (exit codes {rk['codes']}; calls {rk['calls']})")
    if "polygraphy" in flaky:
        lines.append(f"- polygraphy ended in success (exit 0) {flaky['polygraphy']['exit_0']} times (exit codes "
                     f"{flaky['polygraphy']['codes']})")
    return lines


def _cell(row: dict, expect) -> str:
    if row.get("error"):
        return f"error: {row['error']}".replace("|", "/")
    nodes = row["nodes"]
    short = [n.replace("onnx_graphsurgeon_node_", "node ") for n in nodes]
    if expect == "one node":
        mark = " ✔" if len(nodes) == 1 else " ✘"
    elif isinstance(expect, str) and expect.startswith("one "):  # one node of that operator ("one Erf")
        mark = " ✔" if len(nodes) == 1 and nodes[0].endswith(expect[4:]) else " ✘"
    else:
        mark = "" if expect is None else (" ✔" if sorted(nodes) == sorted(expect) else " ✘")
    short = [n.rsplit("/net/", 1)[-1] for n in short]  # transformers exports: the module path
    return (", ".join(short) if len(short) <= 5 else f"{len(short)} nodes") + mark


def _expected(expect) -> str:
    if expect is None:
        return "a Conv→Clip pair"
    if isinstance(expect, str):
        return expect
    return ", ".join(n.replace("onnx_graphsurgeon_node_", "node ").rsplit("/net/", 1)[-1] for n in expect)


def _built_s(row: dict) -> float | None:
    """Estimated TensorRT build seconds of a run, the estimate of record (reprokit/shrink/buildcost.py
    ESTIMATE: a·calls + b·heavy layers built, calls of light layers only priced apart); None for a
    results JSON written before heavy layers were logged. A JSON written before light calls were
    counted prices them as calls with heavy layers only where the row built any heavy layer (a row
    without one made light calls only)."""
    from reprokit.shrink.buildcost import ESTIMATE

    if row.get("heavy_built") is None:
        return None
    light, light_nodes = row.get("light_calls"), row.get("light_nodes")
    if light is None:
        light, light_nodes = (row["calls"], row["nodes_built"]) if row["heavy_built"] == 0 else (0, 0)
    return ESTIMATE.seconds(row["calls"], row["heavy_built"], light, light_nodes)


def _built_nodes_s(row: dict) -> float:
    """The earlier rounds' estimate, kept beside it for comparability (buildcost.TENSORRT: a·calls +
    b·nodes built, the H100 fit)."""
    from reprokit.shrink.buildcost import TENSORRT

    return TENSORRT.seconds(row["calls"], row["nodes_built"])


def _s(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


# issue 39: at most 4 calls; the rest is the search. The calls column counts the Identity probe with
# the search (it is polygraphy-comparable work), the est. split (cost_split) with the fixed calls
FIXED_STEPS = tuple(s for s in cost_split.FIXED_STEPS if s not in ("probe", "attribution"))


def _parts(row: dict) -> tuple[float, float, float] | None:
    """reprokit's (fixed, search, floor) est. seconds (bench/cost_split.py); None for a failed run or
    a results JSON recorded before summary.json named light calls."""
    if not row.get("step_work") or not row.get("model_work") or row["model_work"][1] is None:
        return None
    parts = cost_split.split(row["step_work"], row.get("by_kind"), row["start_nodes"], row["model_work"][1])
    return None if parts is None else (*parts, cost_split.floor(row["model_work"], row["result_work"]))


def _split_cells(row: dict, polygraphy: dict) -> tuple[str, str]:
    parts, pg = _parts(row), _built_s(polygraphy)
    if parts is None:
        return "–", "–"
    ok = "" if pg is None else (" ✔" if parts[1] <= pg else " ✘")
    return f"{parts[0]:.2f} + {parts[1]:.2f}{ok}", f"{parts[2]:.2f}"


def _split_total(results: list[dict]) -> str:
    """Fixed + search and the floor summed over the rows where the split is known, and
    polygraphy's estimate over the same rows."""
    known = [(parts, _built_s(r["polygraphy"])) for r in results if (parts := _parts(r["reprokit"])) is not None]
    if not known or any(pg is None for _, pg in known):
        return "– | –"
    fixed, search, low = (sum(p[i] for p, _ in known) for i in range(3))
    pg = sum(pg for _, pg in known)
    rows = "" if len(known) == len(results) else f", {len(known)} of {len(results)} rows"
    return (f"{fixed:.1f} + {search:.1f} (search {search / max(1e-9, pg):.2f}× polygraphy's {pg:.1f}{rows}) | "
            f"{low:.1f} ({low / max(1e-9, pg):.2f}×)")


def _split_lines(results: list[dict]) -> list[str]:
    """The restated criterion and the rows above polygraphy (bench/cost_split.py) over the rows
    where the split is known; the others named (a run that ended without a result)."""
    rows, unknown = [], []
    for r in results:
        rk, parts, pg = _built_s(r["reprokit"]), _parts(r["reprokit"]), _built_s(r["polygraphy"])
        if rk is None or parts is None or pg is None:
            unknown.append(r["name"])
        else:
            rows.append((r["name"], rk, parts[0], parts[1], pg))
    lines = cost_split.above_lines(rows) if rows else []
    if unknown:
        lines.append(f"No fixed vs search split (no summary.json with light calls) on: {', '.join(unknown)}; rows "
                     "above polygraphy's estimate among all: " + _above(results) + ".")
    return lines


def _above(results: list[dict]) -> str:
    """The rows whose estimate of record is above polygraphy's, with both; '–' without heavy counts."""
    pairs = [(r["name"], _built_s(r["reprokit"]), _built_s(r["polygraphy"])) for r in results]
    if any(rk is None or pg is None for _, rk, pg in pairs):
        return "– (no heavy-layer counts in these results)"
    above = [f"{name} ({rk:.2f} vs {pg:.2f} s)" for name, rk, pg in pairs if rk > pg]
    return ", ".join(above) if above else "none"


def _split_calls(row: dict, polygraphy: dict) -> str:
    """reprokit's calls as search + fixed (summary.json's steps; the probe is the search's), with
    ✔ where the search is at most polygraphy's and the fixed calls at most 4 (issue 39)."""
    if "steps" not in row:
        return "–"
    search = sum(calls for step, calls in row["steps"].items() if step not in FIXED_STEPS)
    fixed = row["calls"] - search
    ok = search <= polygraphy["calls"] and fixed <= 4
    return f"{search} + {fixed}" + (" ✔" if ok else " ✘")


def render(results: list[dict], wall: float | None, flaky: dict | None = None) -> str:
    header = ["scenario", "expected", "reprokit calls", "reprokit search + fixed", "reprokit --replays 0 calls",
              "polygraphy calls",
              "reprokit wall s", "reprokit --replays 0 wall s", "polygraphy wall s",
              "reprokit nodes built", "polygraphy nodes built", "reprokit heavy layers built",
              "polygraphy heavy layers built", "reprokit est. TensorRT build s (heavy layers)",
              "polygraphy est. TensorRT build s (heavy layers)", "reprokit est. fixed + search s",
              "reprokit est. floor s", "reprokit est. build s (per node, old)",
              "polygraphy est. build s (per node, old)", "reprokit result", "reprokit --replays 0 result",
              "polygraphy result", "reprokit 1-minimal"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for res in results:
        rk, r0, pg = res["reprokit"], res["reprokit_replays0"], res["polygraphy"]
        lines.append("| " + " | ".join([res["name"], _expected(res["expect"]), str(rk["calls"]), _split_calls(rk, pg),
                                        str(r0["calls"]),
                                        str(pg["calls"]), f"{rk['wall_s']:.1f}", f"{r0['wall_s']:.1f}",
                                        f"{pg['wall_s']:.1f}", str(rk["nodes_built"]), str(pg["nodes_built"]),
                                        _s(rk.get("heavy_built"), 0), _s(pg.get("heavy_built"), 0),
                                        _s(_built_s(rk)), _s(_built_s(pg)), *_split_cells(rk, pg),
                                        f"{_built_nodes_s(rk):.2f}", f"{_built_nodes_s(pg):.2f}", _cell(rk, res["expect"]), _cell(r0, res["expect"]), _cell(pg, res["expect"]),
                                        "yes" if rk.get("one_minimal") else "no"]) + " |")
    tools = ("reprokit", "reprokit_replays0", "polygraphy")
    calls = {t: sum(r[t]["calls"] for r in results) for t in tools}
    walls = {t: sum(r[t]["wall_s"] for r in results) for t in tools}
    built = {t: sum(r[t]["nodes_built"] for r in results) for t in ("reprokit", "polygraphy")}
    est_old = {t: sum(_built_nodes_s(r[t]) for r in results) for t in ("reprokit", "polygraphy")}
    each = {t: [_built_s(r[t]) for r in results] for t in ("reprokit", "polygraphy")}
    est = {t: None if None in v else sum(v) for t, v in each.items()}
    heavy = {t: None if est[t] is None else sum(r[t]["heavy_built"] for r in results) for t in est}
    ratio = "–" if None in est.values() else f"{est['reprokit'] / max(1e-9, est['polygraphy']):.2f}×"
    pg_calls, pg_wall = max(1, calls["polygraphy"]), max(1e-9, walls["polygraphy"])
    lines.append(f"| **total** | | {calls['reprokit']} | | {calls['reprokit_replays0']} | {calls['polygraphy']} | "
                 f"{walls['reprokit']:.0f} | {walls['reprokit_replays0']:.0f} | {walls['polygraphy']:.0f} | "
                 f"{built['reprokit']} | {built['polygraphy']} | {_s(heavy['reprokit'], 0)} | "
                 f"{_s(heavy['polygraphy'], 0)} | {_s(est['reprokit'], 1)} | {_s(est['polygraphy'], 1)} | "
                 f"{_split_total(results)} | "
                 f"{est_old['reprokit']:.1f} | {est_old['polygraphy']:.1f} | "
                 f"calls {calls['reprokit'] / pg_calls:.2f}× ({calls['reprokit_replays0'] / pg_calls:.2f}× with "
                 f"--replays 0), wall {walls['reprokit'] / pg_wall:.2f}× ({walls['reprokit_replays0'] / pg_wall:.2f}×), "
                 f"nodes built {built['reprokit'] / max(1, built['polygraphy']):.2f}×, est. TensorRT build "
                 f"{ratio} (per node, old: {est_old['reprokit'] / max(1e-9, est_old['polygraphy']):.2f}×) | | | |")
    lines += ["", "Check calls and nodes built counted by bench/count_check.py for both tools; *search + fixed*: "
                  "reprokit's calls outside confirm, calibrate, replay and final (the Identity probe is the search's) "
                  "and in them, ✔ where the search is at most polygraphy's calls and the fixed at most 4; wall: each "
                  "tool's whole command, start-up included" + (f"; {wall:.0f} s in all." if wall is not None else ".")
              + " Estimated TensorRT build seconds (the estimate of record): 0.047 s a call + 6.35 ms a heavy "
                "layer built (convolution, matrix multiply, softmax, normalization), a call of light layers "
                "only 0.0234 s + 0.242 ms a node (TensorRT-RTX on the H200, docs/benchmark.md; 2-4 times low "
                "on survey packs of hundreds of outputs); *per node, old*: "
                "0.0135 s a call + 3.07 ms a node built (the H100 fit of the earlier rounds). *fixed + search*: "
                "reprokit's estimate split by summary.json's steps — fixed: "
              + ", ".join(cost_split.FIXED_STEPS) + " (the probe is fixed here, search in the calls column), and "
                "the layers of the original's copies riding in a search step's pack; search: all else, ✔ where at "
                "most polygraphy's whole estimate (issue 39's criterion restated); *floor*: one build of the "
                "user's model and one of reprokit's result, the least a run that confirms what it reports costs.",
              "", *_split_lines(results)]
    if flaky:
        lines += ["", *_flaky_lines(flaky)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
