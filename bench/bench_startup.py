"""A shrink run's start, side by side on two source trees: ``start.open_run`` (load, check, fold and
its check, weights apart) and ``start.capture`` (the reference activations) of ``emulate:fp16`` on
one model and its inputs, each in a fresh process, the trees alternating ``--repeat`` times so
both see the same load. Prints wall and CPU seconds (this process and its reaped workers) per
part, and the reference's runs as the oracle counts them (calls, worker seconds: the fold's check
included). Issue 39's Swin start-up: the fold's check run doubling as the capture.

    python bench/bench_startup.py MODEL.onnx INPUTS.npz --baseline TREE [--repeat 3]

MODEL: e.g. the Swin export bench_bookkeeping.py makes (``--keep`` keeps it), or a smaller
``SwinModel(SwinConfig(depths=[1, 1, 3, 1]))`` exported the same way (1,635 nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in the child, with PYTHONPATH at the tree measured; prints one JSON line.
_CHILD = r"""
import json, resource, sys, time
from reprokit.engine.session import RunOptions
from reprokit.shrink import start
from reprokit.shrink.budget import Limits
from reprokit.shrink.clock import StepClock

model, inputs, out = sys.argv[1:4]
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
limits = Limits()
new = "capture_within" in start.open_run.__code__.co_varnames  # a tree before the fold's check run took the capture
c0, w0 = cpu(), time.monotonic()
run = start.open_run(model, "emulate:fp16", out, RunOptions(inputs=inputs, tolerance=0.001), False, lambda t: None,
                     StepClock(time.monotonic(), first="setup"), (), {"fold_constants": True},
                     **({"capture_within": limits.capture_chunk_bytes} if new else {}))
c1, w1 = cpu(), time.monotonic()
start.capture(run.oracle, run.model, run.index, run.feeds, [t for o in run.index.node_outputs for t in o],
              run.state_dir, run.models_dir, False, limits, lambda t: None,
              *((run.prepared.check_capture,) if new else ()))
c2, w2 = cpu(), time.monotonic()
print(json.dumps({"setup": w1 - w0, "setup_cpu": c1 - c0, "capture": w2 - w1, "capture_cpu": c2 - c1,
                  "reference_calls": run.oracle.stats.reference, "reference_s": run.oracle.stats.reference_seconds}))
"""


def measure(tree: str, model: str, inputs: str, work: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, model, inputs, os.path.join(work, "out")],
        env=env,
        capture_output=True,
        text=True,
        cwd=work,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("inputs")
    parser.add_argument(
        "--baseline", required=True, help="another reprokit source tree, run first each time"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeat):
        for name, tree in (("baseline", args.baseline), ("this tree", ROOT)):
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as work:
                rows.append(
                    (
                        name,
                        measure(
                            tree, os.path.abspath(args.model), os.path.abspath(args.inputs), work
                        ),
                    )
                )
    print(
        "| tree | setup s (cpu) | capture s (cpu) | setup + capture s (cpu) | reference calls | reference s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        print(
            f"| {name} | {r['setup']:.2f} ({r['setup_cpu']:.2f}) | {r['capture']:.2f} ({r['capture_cpu']:.2f}) | "
            f"{r['setup'] + r['capture']:.2f} ({r['setup_cpu'] + r['capture_cpu']:.2f}) | "
            f"{r['reference_calls']} | {r['reference_s']:.2f} |"
        )
    for name in ("baseline", "this tree"):
        mine = [r for n, r in rows if n == name]
        both = sum(r["setup"] + r["capture"] for r in mine) / len(mine)
        cpu = sum(r["setup_cpu"] + r["capture_cpu"] for r in mine) / len(mine)
        ref = sum(r["reference_s"] for r in mine) / len(mine)
        print(f"{name}: mean setup + capture {both:.2f} s (cpu {cpu:.2f} s), reference {ref:.2f} s")


if __name__ == "__main__":
    main()
