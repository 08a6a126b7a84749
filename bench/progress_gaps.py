"""Silence and bookkeeping on a big model (issue 28 item 8): run `reprokit shrink` and
`reprokit audit` on a generated chain of N nodes with one planted fp16 overflow, timestamp every
progress line as it arrives, and print the longest stretches without a line (the watcher's
"still at it" lines are counted apart: they mark where a step itself says nothing), and how
summary.json's step seconds add up against the process's wall time. A measurement, not a test.

    python bench/progress_gaps.py [--blocks 370] [--out bench/results/progress_gaps.json]
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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain_model(blocks: int, channels: int = 16, size: int = 32, fault_at: float = 0.6) -> onnx.ModelProto:
    """x[1,C,S,S] -> blocks × (Conv1x1 -> Add bias -> Relu -> Mul 1) -> y; in block fault_at·blocks
    the Mul is by 1e6, then one by 1e-6: fine in fp32, inf stored in fp16 (4 nodes a block, + 2)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    current = "x"
    fault = int(blocks * fault_at)
    for b in range(blocks):
        w = (rng.standard_normal((channels, channels, 1, 1)) * np.sqrt(2 / channels)).astype(np.float32)  # He
        inits += [numpy_helper.from_array(w, f"b{b}/w"),
                  numpy_helper.from_array(rng.uniform(0, 0.1, (1, channels, 1, 1)).astype(np.float32), f"b{b}/bias"),
                  numpy_helper.from_array(np.array(1.0 if b != fault else 1e6, np.float32), f"b{b}/scale")]
        nodes += [helper.make_node("Conv", [current, f"b{b}/w"], [f"b{b}/conv"], name=f"b{b}/conv"),
                  helper.make_node("Add", [f"b{b}/conv", f"b{b}/bias"], [f"b{b}/add"], name=f"b{b}/add"),
                  helper.make_node("Relu", [f"b{b}/add"], [f"b{b}/relu"], name=f"b{b}/relu"),
                  helper.make_node("Mul", [f"b{b}/relu", f"b{b}/scale"], [f"b{b}/out"], name=f"b{b}/mul")]
        current = f"b{b}/out"
        if b == fault:
            inits.append(numpy_helper.from_array(np.array(1e-6, np.float32), "fault/unscale"))
            nodes.append(helper.make_node("Mul", [current, "fault/unscale"], ["fault/out"], name="fault/unscale"))
            current = "fault/out"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="output"))
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def timed_run(argv: list[str], cwd: str) -> dict:
    """Run a command, timestamping each stderr line as it arrives."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:
        lines.append((time.monotonic() - start, line.rstrip()))
    stdout = proc.stdout.read()
    proc.wait()
    wall = time.monotonic() - start
    beats = [(t, text) for t, text in lines if "still at it" in text]

    def longest(stamped):
        gap, after, prev_t, prev_text = 0.0, "", 0.0, "(start)"
        for t, text in [*stamped, (wall, "(end)")]:
            if t - prev_t > gap:
                gap, after = t - prev_t, prev_text
            prev_t, prev_text = t, text
        return gap, after

    gap, _ = longest(lines)
    real_gap, after = longest([(t, text) for t, text in lines if "still at it" not in text])
    return {"argv": argv[1:], "exit": proc.returncode, "wall_s": round(wall, 1), "lines": len(lines),
            "longest_gap_s": round(gap, 1), "longest_gap_without_heartbeat_s": round(real_gap, 1),
            "gap_after": after[:120], "heartbeats": len(beats),
            "heartbeat_examples": [text[:120] for _, text in beats[:5]], "stdout_tail": stdout[-400:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=370, help="4 nodes each (370: 1,482 nodes)")
    parser.add_argument("--out", default=None, help="write the measurements as JSON here")
    args = parser.parse_args()
    exe = shutil.which("reprokit") or os.path.join(os.path.dirname(sys.executable), "reprokit")
    work = tempfile.mkdtemp(prefix="reprokit-gaps-")
    model = chain_model(args.blocks)
    onnx.save(model, os.path.join(work, "chain.onnx"))
    print(f"model: {len(model.graph.node)} nodes, in {work}")
    results = {"nodes": len(model.graph.node)}
    shrink = timed_run([exe, "shrink", "chain.onnx", "--target", "emulate:fp16", "-o", "out"], work)
    with open(os.path.join(work, "out", "summary.json")) as handle:
        summary = json.load(handle)
    steps = {s["step"]: s["seconds"] for s in summary["steps"]}
    shrink.update(summary_wall_s=summary["wall_s"], steps_sum_s=round(sum(steps.values()), 2), steps=steps,
                  minimal_nodes=summary["minimal"]["nodes"])
    results["shrink"] = shrink
    results["audit"] = timed_run([exe, "audit", "chain.onnx", "--target", "emulate:fp16", "-o", "audit"], work)
    for name in ("shrink", "audit"):
        r = results[name]
        print(f"{name}: exit {r['exit']}, wall {r['wall_s']} s, {r['lines']} lines; longest gap {r['longest_gap_s']} s; "
              f"longest without the watcher {r['longest_gap_without_heartbeat_s']} s after {r['gap_after']!r}; "
              f"{r['heartbeats']} 'still at it' lines")
    print(f"shrink summary: steps add up to {shrink['steps_sum_s']} s of wall_s {shrink['summary_wall_s']} s "
          f"(process {shrink['wall_s']} s): {shrink['steps']}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=2)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
