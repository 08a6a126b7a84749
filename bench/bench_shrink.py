"""Side-by-side benchmark: ``reprokit shrink`` vs ``polygraphy debug reduce`` (a table, not a test).

    python bench/bench_shrink.py            # samples, planted cases, PP-OCR ×4 each (~25 min on 2 cores)
    python bench/bench_shrink.py --quick    # the five samples only (~1 min)
    python bench/bench_shrink.py --only det --only conv_clip
    BENCH_HF=1 python bench/bench_shrink.py --only hf_   # + bench/bench_numeric_cmd.py's cases

For every model both tools run as subprocesses, each in its own temporary directory, on the same
feeds, judged by the same oracle (``bench/oracle_check.py``: reprokit's backends and comparison,
ORT fp32 reference). Every tool step runs inside a fresh measuring subprocess that reports wall
time and ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the peak RSS of the largest single process of
the tool's tree (workers and check commands included), not the sum of concurrent processes.

Writes ``bench/results/shrink.{md,json}`` (a full run) or ``shrink.partial.{md,json}`` (with
``--only``/``--quick``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
ORACLE = os.path.join(BENCH, "oracle_check.py")
RESULTS = os.path.join(BENCH, "results")
BIN = os.path.dirname(sys.executable)
REPROKIT = os.path.join(BIN, "reprokit")
POLYGRAPHY = os.path.join(BIN, "polygraphy")
sys.path.insert(0, BENCH)

import cost_split  # noqa: E402  (bench/: fixed vs search, the floor)
from count_check import model_work, read_log  # noqa: E402

# Runs CMD..., then writes its wall time, exit code and the peak RSS of its process tree to OUT.
_MEASURE = r"""
import json, resource, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
start = time.monotonic()
rc = subprocess.call(cmd)
wall = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
with open(out, "w") as handle:
    json.dump({"rc": rc, "wall_s": wall, "maxrss_kib": peak}, handle)
"""


def _ocr_model(name: str) -> str:
    import rapidocr_onnxruntime

    return os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models", name)


_GENERATED: dict = {}


def _generated_dir() -> str:
    if "dir" not in _GENERATED:
        _GENERATED["dir"] = tempfile.mkdtemp(prefix="bench-models-")
    return _GENERATED["dir"]


def _picture(name: str, height: int, width: int) -> str:
    """matplotlib's grace_hopper.jpg resized (nearest) to HxW, scaled to [-1, 1] as PP-OCR expects."""
    import matplotlib
    import matplotlib.image as mpimg
    import numpy as np

    image = mpimg.imread(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data",
                                      "grace_hopper.jpg")).astype(np.float32) / 255.0
    rows = (np.arange(height) * image.shape[0] / height).astype(int)
    cols = (np.arange(width) * image.shape[1] / width).astype(int)
    x = ((image[rows][:, cols] - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)
    path = os.path.join(_generated_dir(), f"{name}.npz")
    np.savez(path, x=x)
    return path


def models() -> list[dict]:
    import planted

    with open(os.path.join(ROOT, "samples", "catalog.json")) as handle:
        catalog = json.load(handle)
    out = []
    for sample in catalog["samples"]:
        out.append({
            "name": sample["name"],
            "path": os.path.join(ROOT, "samples", sample["file"]),
            "target": "emulate:fp16",
            "tol": None,
            "shapes": {},
            "inputs": os.path.join(ROOT, "samples", sample["inputs"]),
            "expected": sample["expected"].get("emulate:fp16"),
            "sample": True,
        })
    for name, make in [("planted_blocks", planted.blocks), ("planted_l2norm", planted.l2norm),
                       ("planted_two_faults", planted.two_faults), ("planted_chain2000", planted.chain)]:
        path, inputs = planted.save(*make(), _generated_dir(), name)
        out.append({"name": name, "path": path, "target": "emulate:fp16", "tol": None, "shapes": {},
                    "inputs": inputs, "expected": None, "sample": False, "planted": True})
    if os.environ.get("BENCH_HF"):  # transformers exports, built-in and numeric cmd: checks (opt in)
        import bench_numeric_cmd

        out += bench_numeric_cmd.shrink_specs(_generated_dir())
    for target in ("openvino:bf16", "emulate:bf16"):
        for feeds in ("random", "picture"):
            out.append({
                "name": f"ppocrv4_det {target} {feeds}",
                "path": _ocr_model("ch_PP-OCRv4_det_infer.onnx"),
                "target": target,
                "tol": None,
                "shapes": {"x": [1, 3, 320, 320]},
                # None: seed-0 random feeds written by `reprokit check -o`
                "inputs": _picture("det", 320, 320) if feeds == "picture" else None,
                "expected": "mismatch",
                "sample": False,
            })
            out.append({
                "name": f"ppocrv4_rec {target} {feeds}",
                "path": _ocr_model("ch_PP-OCRv4_rec_infer.onnx"),
                "target": target,
                "tol": 0.01,
                "shapes": {"x": [1, 3, 48, 320]},
                "inputs": _picture("rec", 48, 320) if feeds == "picture" else None,
                "expected": "mismatch",
                "sample": False,
            })
    return out


# ------------------------------------------------------------------------------------------------
# helpers


def measured(cmd: list[str], cwd: str, log: str, *, env: dict | None = None, timeout: float = 900) -> dict:
    """Run ``cmd`` in a fresh measuring subprocess; stdout+stderr go to ``log``."""
    stats = os.path.join(cwd, f".measure-{os.path.basename(log)}.json")
    with open(log, "wb") as handle:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURE, stats, *cmd], cwd=cwd, stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, **(env or {})), start_new_session=True)
        started = time.monotonic()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group only
            proc.wait()
            return {"rc": 124, "wall_s": time.monotonic() - started, "maxrss_kib": 0, "timeout": True,
                    "cmd": cmd}
    with open(stats) as handle:
        result = json.load(handle)
    result["cmd"] = cmd
    return result


def last_error_line(log: str) -> str:
    with open(log, errors="replace") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    for line in reversed(lines):
        if any(word in line for word in ("Error", "error", "[E]", "[!]", "Traceback", "FAILED")):
            return line[:200]
    return lines[-1][:200] if lines else "(no output)"


def dir_mib(path: str) -> float:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total / 2**20


def file_mib(*paths: str) -> float:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p)) / 2**20


def model_nodes(path: str) -> tuple[int, list[str]]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return len(graph.node), sorted(n.op_type for n in graph.node)


def ops_text(ops: list[str], limit: int = 6) -> str:
    counts = collections.Counter(ops).most_common()
    parts = [f"{op}×{n}" if n > 1 else op for op, n in counts]
    if len(parts) > limit:
        parts = parts[:limit] + [f"+{len(parts) - limit} more"]
    return ", ".join(parts)


def judge(model: str, golden: str, inputs: str, target: str, tol: float | None, cwd: str) -> dict:
    """The oracle's verdict on one model (not counted as a tool's target call)."""
    cmd = [sys.executable, ORACLE, model, golden, inputs, "--target", target]
    if tol is not None:
        cmd += ["--tol", repr(tol)]
    env = {k: v for k, v in os.environ.items() if k != "BENCH_CALL_LOG"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=900)
    text = (proc.stdout.strip().splitlines() or [proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""])[-1]
    kind = text.split()[1] if text.startswith("DIVERGES") else ("agree" if text.startswith("AGREES") else "error")
    return {"rc": proc.returncode, "kind": kind, "line": text}


def shape_arg(name: str, dims) -> str:
    return f"{name}:[{','.join(str(int(d)) for d in dims)}]"


# ------------------------------------------------------------------------------------------------
# the two tools


def prepare_feeds(spec: dict, work: str) -> dict:
    """`reprokit check -o`: the exact feeds both tools get, and the original's verdict kind."""
    out = os.path.join(work, "check")
    cmd = [REPROKIT, "check", spec["path"], "--target", spec["target"], "-o", out, "--json"]
    if spec["inputs"]:
        cmd += ["--inputs", spec["inputs"]]
    for name, dims in spec["shapes"].items():
        cmd += ["--input-shapes", f"{name}:{'x'.join(map(str, dims))}"]
    if spec["tol"] is not None:
        cmd += ["--tol", repr(spec["tol"])]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=900)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"reprokit check failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    report = json.loads(proc.stdout)
    worst = max(report["verdict"]["outputs"], key=lambda o: (o["exceeds"], float(o["error"])), default={})
    return {
        "npz": os.path.join(out, "inputs.npz"),
        "kind": report["verdict"]["signature"]["kind"],
        "rel_l2": worst.get("rel_l2"),
        "command": shlex.join(cmd),
    }


def run_reprokit(spec: dict, feeds: dict, work: str, pack_by: str | None = None) -> dict:
    """One ``reprokit shrink`` run; ``pack_by``: its --pack-by (None: the target's default)."""
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "out")
    cmd = [REPROKIT, "shrink", spec["path"], "--target", spec["target"], "--inputs", feeds["npz"], "-o", out,
           "--json"] + (["--pack-by", pack_by] if pack_by else [])
    for name, dims in spec["shapes"].items():
        cmd += ["--input-shapes", f"{name}:{'x'.join(map(str, dims))}"]
    if spec["tol"] is not None:
        cmd += ["--tol", repr(spec["tol"])]
    log = os.path.join(work, "shrink.log")
    m = measured(cmd, work, log, timeout=spec.get("step_timeout", 900))
    row = {"tool": "reprokit", "commands": [shlex.join(cmd)], "wall_s": m["wall_s"],
           "peak_mib": m["maxrss_kib"] / 1024, "rc": m["rc"]}
    summary_path = os.path.join(out, "summary.json")
    if m["rc"] != 0 or not os.path.exists(summary_path):
        row["error"] = "timeout" if m.get("timeout") else f"crashed: {last_error_line(log)}"
        row["activations_mib"] = dir_mib(os.path.join(out, ".reprokit", "activations"))
        return row
    with open(summary_path) as handle:
        summary = json.load(handle)
    common = {
        "status": summary["status"],
        "start_nodes": summary["original"]["nodes"],
        "calls": summary["calls"]["target"],
        "reference_calls": summary["calls"]["reference"],
        "cached": summary["calls"]["cached"],
        "one_minimal": summary.get("one_minimal"),
        "nodes_built": summary.get("build_work", {}).get("nodes_built"),
        "heavy_built": summary.get("build_work", {}).get("heavy_built"),
        # calls of light layers only (none before summary.json named them: priced as heavy)
        "light_calls": summary.get("build_work", {}).get("light_calls"),
        "light_nodes": summary.get("build_work", {}).get("light_nodes"),
        "built_by": summary.get("build_work", {}).get("by_kind"),
        "signature": summary["signature"]["kind"],
        "steps": summary.get("steps"),
        "activations_mib": dir_mib(os.path.join(out, ".reprokit", "activations")),
        "state_dir_mib": dir_mib(os.path.join(out, ".reprokit")),
        "resources": summary.get("resources"),
        # (nodes, heavy layers) of one build of the user's model and of the result, for the floor;
        # an accumulated error's result is a run of the whole model (the printed workaround)
        "model_work": model_work(spec["path"]),
    }
    if summary["status"] == "accumulated":  # no model is called minimal: the attribution instead
        found = summary["attribution"]
        row.update(common, minimal_nodes=0, minimal_ops=[], kept=True, attribution=found,
                   result_work=common["model_work"],
                   judged={"kind": "accumulated", "line": f"attribution: {found['diverging_alone']} of "
                           f"{found['nodes_judged_alone']} nodes exceed the tolerance alone; top "
                           + ", ".join(f"{t['node']} {t['error']:.3g}" if not isinstance(t['error'], str)
                                       else t['node'] for t in found["top"][:3])})
        return row
    minimal = os.path.join(out, "minimal.onnx")
    verdict = judge(minimal, os.path.join(out, "reference_outputs.npz"), os.path.join(out, "inputs.npz"),
                    spec["target"], spec["tol"], work)
    row.update(common)
    row.update({
        "minimal_nodes": summary["minimal"]["nodes"],
        "minimal_ops": summary["minimal"]["ops"],
        "minimal_inputs": summary["minimal"]["inputs"],
        "minimal_outputs": summary["minimal"]["outputs"],
        "own_final_kind": summary.get("verdict", {}).get("signature", {}).get("kind"),
        "judged": verdict,
        "kept": verdict["kind"] == feeds["kind"],
        # another kind accepted by the causal test (an Inf that causes the original's mismatch)
        "causal": bool(summary.get("no_slippage", {}).get("accepted", {}).get("shows it: causal test")),
        "result_work": model_work(minimal),
    })
    return row


def run_polygraphy(spec: dict, feeds: dict, work: str) -> dict:
    import numpy as np
    from polygraphy.json import save_json

    os.makedirs(work, exist_ok=True)
    with np.load(feeds["npz"], allow_pickle=False) as data:
        arrays = {k: np.array(data[k]) for k in data.files}
    save_json([arrays], os.path.join(work, "feeds.json"))  # the same feeds, as polygraphy JSON
    shapes = [shape_arg(n, a.shape) for n, a in arrays.items()]
    check = [sys.executable, ORACLE, "polygraphy_debug.onnx", "layerwise_golden.json", "layerwise_inputs.json",
             "--target", spec["target"]]
    if spec["tol"] is not None:
        check += ["--tol", repr(spec["tol"])]
    steps = [
        ("sanitize", [POLYGRAPHY, "surgeon", "sanitize", spec["path"], "--fold-constants",
                      "--override-input-shapes", *shapes, "-o", "folded.onnx"]),
        ("run_mark_all", [POLYGRAPHY, "run", "folded.onnx", "--onnxrt", "--load-inputs", "feeds.json",
                          "--save-inputs", "inputs.json", "--onnx-outputs", "mark", "all",
                          "--save-outputs", "layerwise_golden.json"]),
        ("data_merge", [POLYGRAPHY, "data", "merge", "inputs.json", "layerwise_golden.json",
                        "-o", "layerwise_inputs.json"]),
        ("reduce", [POLYGRAPHY, "debug", "reduce", "folded.onnx", "-o", "reduced.onnx", "--mode=bisect",
                    "--load-inputs", "layerwise_inputs.json", "--fail-regex", f"DIVERGES {feeds['kind']}",
                    "--check", *check]),
    ]
    extra = spec.get("polygraphy_extra", {})  # e.g. external-data flags for models over 2 GB
    if spec.get("skip_sanitize"):  # the model is used as it is (see bench_big.py for why)
        shutil.copyfile(spec["path"], os.path.join(work, "folded.onnx"))
        steps = [(name, cmd) for name, cmd in steps if name != "sanitize"]

    def with_extra(name, cmd):  # before --check, which takes the rest of the command line
        at = cmd.index("--check") if "--check" in cmd else len(cmd)
        return cmd[:at] + extra.get(name, []) + cmd[at:]

    steps = [(name, with_extra(name, cmd)) for name, cmd in steps]
    call_log = os.path.join(work, "calls.log")
    open(call_log, "w").close()
    row = {"tool": "polygraphy", "commands": [], "wall_s": 0.0, "peak_mib": 0.0, "step_s": {}}
    for name, cmd in steps:
        log = os.path.join(work, f"{name}.log")
        m = measured(cmd, work, log, env={"BENCH_CALL_LOG": call_log}, timeout=spec.get("step_timeout", 900))
        row["commands"].append(shlex.join(cmd))
        row["wall_s"] += m["wall_s"]
        row["step_s"][name] = round(m["wall_s"], 3)
        row["peak_mib"] = max(row["peak_mib"], m["maxrss_kib"] / 1024)
        row["rc"] = m["rc"]
        # bench/oracle_check.py's lines: nodes and heavy layers per call
        logged = read_log(call_log)
        row["calls"] = len(logged)
        row["call_nodes"] = [nodes for nodes, _ in logged]
        row["nodes_built"] = sum(row["call_nodes"])
        heavy = [h for _, h in logged]
        row["heavy_built"] = None if None in heavy else sum(heavy)
        light = [nodes for nodes, h in logged if h == 0]
        row["light_calls"], row["light_nodes"] = (None, None) if None in heavy else (len(light), sum(light))
        if name in ("sanitize", "run_mark_all") and m["rc"] == 0 and "start_nodes" not in row:
            row["start_nodes"] = model_nodes(os.path.join(work, "folded.onnx"))[0]
        if m["rc"] != 0 or (name == "reduce" and not os.path.exists(os.path.join(work, "reduced.onnx"))):
            row["error"] = "timeout" if m.get("timeout") else f"crashed in {name}: {last_error_line(log)}"
            break
    row["activations_mib"] = file_mib(os.path.join(work, "layerwise_golden.json"),
                                      os.path.join(work, "layerwise_inputs.json"))
    if "error" in row:
        return row
    nodes, ops = model_nodes(os.path.join(work, "reduced.onnx"))
    verdict = judge(os.path.join(work, "reduced.onnx"), os.path.join(work, "layerwise_golden.json"),
                    os.path.join(work, "layerwise_inputs.json"), spec["target"], spec["tol"], work)
    with open(os.path.join(work, "reduce.log"), errors="replace") as handle:
        reduce_log = handle.read()
    row.update({
        "status": "done",
        "minimal_nodes": nodes,
        "minimal_ops": ops,
        "judged": verdict,
        "kept": verdict["kind"] == feeds["kind"],
        "suggests_linear": "--mode=linear" in reduce_log,
    })
    return row


# ------------------------------------------------------------------------------------------------
# table


def fmt(value, digits=1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ratio(a, b) -> str:
    if a is None or b is None or not b:
        return "—"
    return f"{a / b:.2f}×"


HEADER = ["model", "nodes", "target", "tool", "target calls", "nodes built", "build-cost policy: calls, nodes built",
          "est. TensorRT build, heavy layers (s)", "est. build, per node, old (s)", "est. build: fixed + search (s)",
          "est. floor (s)", "wall time (s)", "peak memory (MiB)",
          "disk for activations (MiB)", "minimal nodes", "minimal ops", "signature kind kept", "1-minimal"]


def render(payload: dict) -> str:
    """The Markdown table, a line on the environment and per-model notes."""
    env = payload["environment"]
    results = payload["results"]
    lines = [table(results), "",
             f"Benchmark wall time {payload['total_wall_s']:.0f} s; {env['machine']} ({env['cpu']}), 1-min load "
             f"average {env['load_average_1m']['start']} at start, {env['load_average_1m']['end']} at end; "
             f"reprokit {env['reprokit']} ({env['reprokit_tree']}), polygraphy {env['polygraphy']}, onnxruntime "
             f"{env['onnxruntime']}, openvino {env['openvino']}."
             + (f" polygraphy's rows are reused from the run at {env['polygraphy_from']} (`--polygraphy-from`: "
                "its calls and nodes built are deterministic; its wall times and memory are that run's)."
                if env.get("polygraphy_from") else ""), "",
             "Notes per model (reprokit: total size of its `.reprokit/` state directory, which also keeps every "
             "call's feeds and outputs; polygraphy: seconds per step; both: the oracle's verdict on the final model):",
             ""]
    for res in results:
        if res.get("error"):
            lines.append(f"- {res['name']}: {res['error']}")
            continue
        rk, pg = res["reprokit"], res["polygraphy"]
        parts = []
        if not rk.get("error"):
            parts.append(f"reprokit state dir {rk['state_dir_mib']:.0f} MiB, {rk['cached']} cached verdicts, "
                         f"1-minimal {'yes' if rk.get('one_minimal') else 'no'}; final: `{rk['judged']['line']}`")
        if pg.get("step_s"):
            steps = ", ".join(f"{k} {v:.1f}" for k, v in pg["step_s"].items())
            parts.append(f"polygraphy steps (s): {steps}" + ("; it suggests `--mode=linear` next"
                                                            if pg.get("suggests_linear") else "")
                         + (f"; final: `{pg['judged']['line']}`" if pg.get("judged") else ""))
        lines.append(f"- {res['name']}: " + "; ".join(parts))
    return "\n".join(lines)


def build_estimate(row: dict) -> float | None:
    """Estimated TensorRT build seconds of one tool's run, the estimate of record: a·calls + b·heavy
    layers built (reprokit/shrink/buildcost.py ESTIMATE, the TensorRT-RTX fit on the H200's pass/fail
    builds, bench/trt_buildcost_fit.py; 2-4 times low on survey packs of hundreds of outputs:
    docs/benchmark.md). None for a run recorded before heavy layers were counted."""
    from reprokit.shrink.buildcost import ESTIMATE

    if row.get("calls") is None or row.get("heavy_built") is None:
        return None
    # calls of light layers only priced apart: polygraphy's from its call log, reprokit's from
    # summary.json's build_work (a run recorded before it named them: priced as heavy, an upper bound)
    return ESTIMATE.seconds(
        row["calls"], row["heavy_built"], row.get("light_calls") or 0, row.get("light_nodes") or 0
    )


def build_estimate_nodes(row: dict) -> float | None:
    """The earlier rounds' estimate, kept beside it for comparability: a·calls + b·nodes built (the
    H100 fit, buildcost.TENSORRT, which ``--pack-by build-cost`` still packs by)."""
    from reprokit.shrink.buildcost import TENSORRT

    if row.get("calls") is None or row.get("nodes_built") is None:
        return None
    return TENSORRT.seconds(row["calls"], row["nodes_built"])


def trt_row(res: dict, tool: str) -> dict:
    """The run whose build work the estimate reads: reprokit's made with ``--pack-by build-cost``
    (the policy it uses on trt targets; the bench's targets default to packing by count), where
    it ran; polygraphy's only run."""
    if tool == "reprokit" and res.get("reprokit_cost") and not res["reprokit_cost"].get("error"):
        return res["reprokit_cost"]
    return res[tool]


def cost_cell(res: dict, tool: str) -> str:
    """The build-cost run's calls and nodes built, and whether its answer is the default run's."""
    r = res.get("reprokit_cost") if tool == "reprokit" else None
    if not r:
        return "—"
    if r.get("error"):
        return r["error"].replace("|", "/")[:60]
    same = (r.get("minimal_ops") == res["reprokit"].get("minimal_ops")
            and r.get("status") == res["reprokit"].get("status"))
    return f"{r['calls']}, {r['nodes_built']}" + ("" if same else f" (answer: {ops_text(r.get('minimal_ops') or [])})")


def cost_parts(res: dict) -> tuple[float, float, float] | None:
    """reprokit's (fixed, search, floor) est. seconds, on the run the estimate reads (trt_row);
    None where that run failed or was recorded before light calls were named."""
    r = res.get("reprokit") and trt_row(res, "reprokit")
    if not r or r.get("error") or not r.get("model_work") or not r.get("result_work") or r["model_work"][1] is None:
        return None
    parts = cost_split.split(r.get("steps"), r.get("built_by"), r.get("start_nodes") or r["model_work"][0],
                             r["model_work"][1])
    return None if parts is None else (*parts, cost_split.floor(r["model_work"], r["result_work"]))


def split_cells(res: dict, tool: str) -> tuple[str, str]:
    parts = cost_parts(res) if tool == "reprokit" else None
    return ("—", "—") if parts is None else (f"{parts[0]:.2f} + {parts[1]:.2f}", f"{parts[2]:.2f}")


def split_ratio_cells(res: dict) -> tuple[str, str]:
    """The ratio row: reprokit's search against polygraphy's whole estimate (the restated
    criterion, ✔ where at most), and the floor against it."""
    parts, pg = cost_parts(res), build_estimate(res["polygraphy"])
    if parts is None or pg is None:
        return "—", "—"
    return f"search {ratio(parts[1], pg)}" + (" ✔" if parts[1] <= pg else " ✘"), ratio(parts[2], pg)


def split_total_cells(both: list[dict]) -> tuple[str, str]:
    """Fixed + search and the floor over the rows where the split is known, each against
    polygraphy's estimate over the same rows."""
    known = [(p, pg) for r in both if (p := cost_parts(r)) is not None and (pg := build_estimate(r["polygraphy"]))]
    if not known:
        return "—", "—"
    fixed, search, low = (sum(p[i] for p, _ in known) for i in range(3))
    pg = sum(pg for _, pg in known)
    rows = "" if len(known) == len(both) else f" ({len(known)} of {len(both)} rows)"
    return (f"{fixed:.1f} + {search:.1f}; search/polygraphy {search:.1f}/{pg:.1f} = {ratio(search, pg)}{rows}",
            f"{low:.1f}/{pg:.1f} = {ratio(low, pg)}{rows}")


def split_lines(both: list[dict]) -> list[str]:
    """cost_split.above_lines over the rows whose split is known."""
    rows = []
    for r in both:
        parts, rk, pg = cost_parts(r), build_estimate(trt_row(r, "reprokit")), build_estimate(r["polygraphy"])
        if parts is not None and rk is not None and pg is not None:
            rows.append((r["name"], rk, parts[0], parts[1], pg))
    if len(rows) < len(both):
        return [f"Fixed vs search: known on {len(rows)} of {len(both)} rows (the others recorded before "
                "summary.json named light calls)."] + (cost_split.above_lines(rows) if rows else [])
    return cost_split.above_lines(rows)


def table(results: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for res in results:
        target = res["target"] + (f" (tol {res['tol']:g})" if res["tol"] is not None else "")
        target += f"; {res['feeds']['kind']}" if res.get("feeds") else ""
        if res.get("error"):
            lines.append(f"| {res['name']} | {res.get('file_nodes', '—')} | {target} | — | {res['error']} |"
                         + " |" * (len(HEADER) - 5))
            continue
        rows = {}
        for tool in ("reprokit", "polygraphy"):
            r = res[tool]
            rows[tool] = r
            nodes = f"{res['file_nodes']} → {r['start_nodes']}" if r.get("start_nodes") else str(res["file_nodes"])
            if r.get("error"):
                cells = [res["name"], nodes, target, tool, fmt(r.get("calls")), fmt(r.get("nodes_built")), cost_cell(res, tool),
                         fmt(build_estimate(trt_row(res, tool)), 2), fmt(build_estimate_nodes(trt_row(res, tool)), 2),
                         *split_cells(res, tool),
                         fmt(r["wall_s"]), fmt(r["peak_mib"], 0), fmt(r.get("activations_mib")),
                         r["error"].replace("|", "/"), "", "", ""]
            elif r.get("status") == "accumulated":
                cells = [res["name"], nodes, target, tool, fmt(r["calls"]), fmt(r.get("nodes_built")), cost_cell(res, tool),
                         fmt(build_estimate(trt_row(res, tool)), 2), fmt(build_estimate_nodes(trt_row(res, tool)), 2),
                         *split_cells(res, tool),
                         fmt(r["wall_s"]),
                         fmt(r["peak_mib"], 0), fmt(r["activations_mib"]), "accumulated: attribution",
                         f"fp32-nodes={r['attribution']['fp32_nodes'][:60]}…", "—", "—"]
            else:
                kept = ("yes" if r["kept"] else "no") + f" ({r['judged']['kind']})"
                if not r["kept"] and r.get("causal"):
                    kept = f"causes it ({r['judged']['kind']} → original's kind, causal test)"
                one = {True: "yes", False: "no"}.get(r.get("one_minimal"), "—")
                cells = [res["name"], nodes, target, tool, fmt(r["calls"]), fmt(r.get("nodes_built")), cost_cell(res, tool),
                         fmt(build_estimate(trt_row(res, tool)), 2), fmt(build_estimate_nodes(trt_row(res, tool)), 2),
                         *split_cells(res, tool),
                         fmt(r["wall_s"]),
                         fmt(r["peak_mib"], 0), fmt(r["activations_mib"]), fmt(r["minimal_nodes"]),
                         ops_text(r["minimal_ops"]), kept, one]
            lines.append("| " + " | ".join(cells) + " |")
        rk, pg = rows["reprokit"], rows["polygraphy"]
        pg_ok = not pg.get("error")
        lines.append("| " + " | ".join([
            res["name"], "", "", "**reprokit/polygraphy**",
            ratio(rk.get("calls"), pg.get("calls")) if pg_ok else "—",
            ratio(rk.get("nodes_built"), pg.get("nodes_built")) if pg_ok else "—",
            ratio(trt_row(res, "reprokit").get("nodes_built"), pg.get("nodes_built")) if pg_ok else "—",
            ratio(build_estimate(trt_row(res, "reprokit")), build_estimate(pg)) if pg_ok else "—",
            ratio(build_estimate_nodes(trt_row(res, "reprokit")), build_estimate_nodes(pg)) if pg_ok else "—",
            *(split_ratio_cells(res) if pg_ok else ("—", "—")),
            ratio(rk.get("wall_s"), pg.get("wall_s")) if pg_ok and not pg.get("reused_from")
            else "— (polygraphy's from another run)" if pg_ok else "—",
            "", "", "", "", "", ""]) + " |")
    both = [r for r in results if not r.get("error") and not r["reprokit"].get("error")
            and not r["polygraphy"].get("error")]
    if both:
        rk_calls = sum(r["reprokit"]["calls"] for r in both)
        pg_calls = sum(r["polygraphy"]["calls"] for r in both)
        rk_wall = sum(r["reprokit"]["wall_s"] for r in both)
        pg_wall = sum(r["polygraphy"]["wall_s"] for r in both)
        rk_built = sum(r["reprokit"].get("nodes_built") or 0 for r in both)
        pg_built = sum(r["polygraphy"].get("nodes_built") or 0 for r in both)
        rk_each = [build_estimate(trt_row(r, "reprokit")) for r in both]
        pg_each = [build_estimate(r["polygraphy"]) for r in both]
        heavy_known = None not in rk_each + pg_each  # a results JSON from before heavy layers were counted: —
        rk_est, pg_est = sum(rk_each) if heavy_known else None, sum(pg_each) if heavy_known else None
        rk_old = sum(build_estimate_nodes(trt_row(r, "reprokit")) or 0 for r in both)
        pg_old = sum(build_estimate_nodes(r["polygraphy"]) or 0 for r in both)
        rk_cost_built = sum(trt_row(r, "reprokit").get("nodes_built") or 0 for r in both)
        lines.append("| " + " | ".join([
            f"**total, {len(both)} models where both finished**", "", "", "**reprokit/polygraphy**",
            f"{rk_calls}/{pg_calls} = {ratio(rk_calls, pg_calls)}",
            f"{rk_built}/{pg_built} = {ratio(rk_built, pg_built)}",
            f"{rk_cost_built}/{pg_built} = {ratio(rk_cost_built, pg_built)}",
            f"{rk_est:.1f}/{pg_est:.1f} = {ratio(rk_est, pg_est)}" if heavy_known else "—",
            f"{rk_old:.1f}/{pg_old:.1f} = {ratio(rk_old, pg_old)}",
            *split_total_cells(both),
            "— (polygraphy's from another run)" if any(r["polygraphy"].get("reused_from") for r in both)
            else f"{rk_wall:.1f}/{pg_wall:.1f} = {ratio(rk_wall, pg_wall)}", "", "", "", "", "", ""]) + " |")
        lines.append("")
        for label, estimate in (("heavy layers, the estimate of record", build_estimate),
                                ("per node, old", build_estimate_nodes)):
            pairs = [(r["name"], estimate(trt_row(r, "reprokit")), estimate(r["polygraphy"])) for r in both]
            if any(rk is None or pg is None for _, rk, pg in pairs):
                lines.append(f"Estimated TensorRT build ({label}): — (runs recorded before heavy layers were counted).")
                continue
            over = [f"{name} ({rk:.2f} vs {pg:.2f} s)" for name, rk, pg in pairs if rk > pg]
            lines.append(f"Estimated TensorRT build ({label}) above polygraphy's on {len(over)} of {len(both)} rows"
                         + (f": {', '.join(over)}" if over else "") + ".")
        lines += split_lines(both)
        lines.append("Calls of light layers only (no heavy layer) are priced at the light rate, polygraphy's from "
                     "its call log, reprokit's from summary.json's `light_calls`/`light_nodes` (bench/count_check.py's "
                     "rule; a run recorded before summary.json named them prices them as calls with heavy layers). "
                     "*fixed + search*: reprokit's estimate split by summary.json's steps — fixed: "
                     f"{', '.join(cost_split.FIXED_STEPS)}, and the layers of the original's copies riding in a "
                     "search step's pack (a confirmation carried by the survey); search: all else. *floor*: one "
                     "build of the user's model and one of the result (an accumulated error's: the whole model "
                     "again, the printed workaround) — the least a run that confirms what it reports can cost.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run only models whose name contains this (repeatable)")
    parser.add_argument("--quick", action="store_true", help="the five samples only")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--polygraphy-from", metavar="JSON",
                        help="reuse polygraphy's rows of an earlier results JSON (its calls and nodes built are "
                             "deterministic; its wall and memory are that run's) instead of running it again")
    parser.add_argument("--no-cost-run", action="store_true",
                        help="skip reprokit's second run with --pack-by build-cost (the est. TensorRT build column "
                             "then reads the default run)")
    parser.add_argument("--render", metavar="JSON", help="only print the table of an earlier results JSON")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as handle:
            print(render(json.load(handle)))
        return 0

    earlier = {}
    if args.polygraphy_from:
        with open(args.polygraphy_from) as handle:
            before = json.load(handle)
        tree = before["environment"].get("reprokit_tree", "?")
        earlier = {r["name"]: dict(r["polygraphy"], reused_from=tree) for r in before["results"]
                   if r.get("polygraphy") and not r["polygraphy"].get("error")}
    selected = models()
    if args.quick:
        selected = [m for m in selected if m["sample"]]
    if args.only:
        selected = [m for m in selected if any(o in m["name"] for o in args.only)]
        if not selected:
            parser.error(f"no model matches {args.only}; models: {', '.join(m['name'] for m in models())}")
    partial = len(selected) != len(models())

    started = time.monotonic()
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(prefix="bench-shrink-")
    results = []
    try:
        for spec in selected:
            work = os.path.join(root, spec["name"].replace(" ", "_").replace(":", "-"))
            os.makedirs(work)
            res = {k: spec[k] for k in ("name", "path", "target", "tol", "shapes", "expected")}
            res["file_nodes"] = model_nodes(spec["path"])[0]
            print(f"== {spec['name']} ({res['file_nodes']} nodes, {spec['target']})", file=sys.stderr, flush=True)
            try:
                feeds = prepare_feeds(spec, work)
            except Exception as exc:  # report and go on with the next model
                res["error"] = f"feeds: {exc}"
                results.append(res)
                continue
            res["feeds"] = feeds
            print(f"   original: {feeds['kind']} (rel L2 {feeds['rel_l2']})", file=sys.stderr, flush=True)
            res["reprokit"] = run_reprokit(spec, feeds, os.path.join(work, "reprokit"))
            r = res["reprokit"]
            print(f"   reprokit:   {r.get('error') or ''} calls {r.get('calls')} wall {r['wall_s']:.1f} s "
                  f"→ {r.get('minimal_nodes')} nodes", file=sys.stderr, flush=True)
            if not args.no_cost_run:  # the trt policy, for the estimate (the target's own stays in the table)
                res["reprokit_cost"] = run_reprokit(spec, feeds, os.path.join(work, "reprokit-cost"), "build-cost")
                r = res["reprokit_cost"]
                print(f"   reprokit --pack-by build-cost: {r.get('error') or ''} calls {r.get('calls')} "
                      f"nodes built {r.get('nodes_built')} → {r.get('minimal_nodes')} nodes", file=sys.stderr, flush=True)
            if spec["name"] in earlier:  # --polygraphy-from: that run's row, as it was
                res["polygraphy"] = earlier[spec["name"]]
            else:
                res["polygraphy"] = run_polygraphy(spec, feeds, os.path.join(work, "polygraphy"))
            r = res["polygraphy"]
            print(f"   polygraphy: {r.get('error') or ''} calls {r.get('calls')} wall {r['wall_s']:.1f} s "
                  f"→ {r.get('minimal_nodes')} nodes", file=sys.stderr, flush=True)
            results.append(res)
    finally:
        if args.keep:
            print(f"work directories kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    total = time.monotonic() - started

    import onnxruntime
    import openvino
    import polygraphy

    import reprokit

    env = {
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "cpu": _cpu_name(),
        "reprokit": getattr(reprokit, "__version__", "?"),
        "polygraphy": polygraphy.__version__,
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino.__version__,
        "reprokit_tree": _git_state(),
        "load_average_1m": {"start": round(load_before[0], 2), "end": round(os.getloadavg()[0], 2)},
        **({"polygraphy_from": next(iter(earlier.values()))["reused_from"]} if earlier else {}),
    }
    payload = {"schema": "bench.shrink/1", "total_wall_s": round(total, 1), "environment": env,
               "results": results}
    text = render(payload)
    print(text)
    os.makedirs(RESULTS, exist_ok=True)
    stem = "shrink.partial" if partial else "shrink"
    with open(os.path.join(RESULTS, stem + ".md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(RESULTS, stem + ".json"), "w") as handle:
        json.dump(payload, handle, indent=1, default=_json_default)
    import build_breakdown  # bench/: where each run's nodes built went, beside polygraphy's calls

    with open(os.path.join(RESULTS, stem + ".build.md"), "w") as handle:
        handle.write(build_breakdown.render(payload) + "\n")
    return 0


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return str(value)


def _git_state() -> str:
    """Commit and whether reprokit/ has uncommitted edits (read-only git commands)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "reprokit"], cwd=ROOT, capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no git"
    return f"commit {head}" + (f", {len(dirty.splitlines())} uncommitted file(s) in reprokit/" if dirty else "")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    sys.exit(main())
