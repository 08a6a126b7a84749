"""What the engine workers' memory bound (reprokit/engine/memorybound.py) costs and stops: every
bundled sample, the Swin-T export of issue 39 (check and shrink) and two crafted bombs, each run
by the ``reprokit`` command under a given ``--memory-bound``, side by side with the largest
process's peak RSS of the run's tree (``getrusage(RUSAGE_CHILDREN).ru_maxrss``) and its wall.

    python bench/bench_memory_bound.py [--bound 1G] [--dir /tmp/reprokit-membound] [--no-swin]

Every run starts under an outer RLIMIT_DATA of 8 GiB (a guard for the machine: the bombs are
never run without a bound). Prints a Markdown table; writes bench/results/memory_bound.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
GUARD = 8 << 30
WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, stdin=subprocess.DEVNULL)\n"
    "lines = [l for l in p.stderr.splitlines() if l.startswith('Error:')]\n"
    "print(json.dumps({'rc': p.returncode, 'wall': time.perf_counter() - t, 'error': lines[-1] if lines else '',\n"
    "                  'peak_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n"
)


def bombs(folder: str) -> list[tuple[str, str]]:
    """The crafted models of tests/test_memory_bound.py: an Expand to 1.5 GiB, a doubling Loop."""
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the test module imports its conftest
    from tests.models import save
    from tests.test_memory_bound import expand_bomb, loop_bomb

    return [("Expand to 1.5 GiB", save(expand_bomb(24 << 20), os.path.join(folder, "expand_bomb.onnx"))),
            ("Loop doubling 64 times", save(loop_bomb(), os.path.join(folder, "loop_bomb.onnx")))]


def cases(folder: str, swin: bool) -> list[tuple[str, list[str]]]:
    runs = []
    for name in sorted(os.listdir(os.path.join(ROOT, "samples"))):
        if name.endswith(".onnx"):
            model = os.path.join(ROOT, "samples", name)
            inputs = model.replace(".onnx", ".inputs.npz")
            runs.append((f"sample {name[:-5]}", ["check", model, "--target", "emulate:fp16", "--inputs", inputs]))
    if swin:
        sys.path.insert(0, BENCH)
        from bench_bookkeeping import swin as make_swin

        model, inputs = make_swin(folder)
        common = ["--inputs", inputs, "--tol", "0.001"]
        runs += [("swin check", ["check", model, "--target", "emulate:fp16", *common]),
                 ("swin check openvino", ["check", model, "--target", "openvino:f32", *common]),
                 ("swin shrink", ["shrink", model, "--target", "emulate:fp16", *common, "--no-pack", "--force",
                                  "-o", os.path.join(folder, "swin-out")])]
    runs += [(name, ["check", path, "--target", "emulate:fp16"]) for name, path in bombs(folder)]
    return runs


def run(args: list[str], bound: str) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "reprokit")
    done = subprocess.run([sys.executable, "-c", WRAPPER, exe, *args, "--memory-bound", bound], capture_output=True,
                          text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (GUARD, GUARD)))
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bound", default="1G")
    parser.add_argument("--dir", default="/tmp/reprokit-membound")
    parser.add_argument("--no-swin", action="store_true")
    ns = parser.parse_args()
    os.makedirs(ns.dir, exist_ok=True)
    rows = []
    for name, args in cases(ns.dir, not ns.no_swin):
        found = run(args, ns.bound)
        rows.append({"case": name, "command": args[0], "bound": ns.bound, **found})
        print(f"{name}: exit {found['rc']}, peak {found['peak_mib']:.0f} MiB, {found['wall']:.1f} s", file=sys.stderr)
    lines = [f"Memory bound {ns.bound} (`--memory-bound`), outer RLIMIT_DATA guard 8 GiB; "
             f"{time.strftime('%Y-%m-%d')}.", "",
             "| case | command | exit | largest process peak RSS (MiB) | wall (s) | error |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['command']} | {r['rc']} | {r['peak_mib']:.0f} | {r['wall']:.1f} | {r['error'][:160]} |"
              for r in rows]
    print("\n".join(lines))
    results = os.path.join(BENCH, "results")
    with open(os.path.join(results, "memory_bound.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(os.path.join(results, "memory_bound.json"), "w") as handle:
        json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
