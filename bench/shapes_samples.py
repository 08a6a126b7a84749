"""Shape shrinking on every bundled sample (a table, not a test): node reduction under
emulate:fp16 with the sample's own feeds, then the minimal model's input elements before and after
shape shrinking, the signature kind before and after, and the target calls it took.

    python bench/shapes_samples.py        # writes bench/results/shapes.{md,json}
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPROKIT = os.path.join(os.path.dirname(sys.executable), "reprokit")


def main() -> int:
    with open(os.path.join(ROOT, "samples", "catalog.json")) as handle:
        samples = json.load(handle)["samples"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-shapes-") as work:
        for sample in samples:
            out = os.path.join(work, sample["name"])
            proc = subprocess.run(
                [REPROKIT, "shrink", os.path.join(ROOT, "samples", sample["file"]), "--target", "emulate:fp16",
                 "--inputs", os.path.join(ROOT, "samples", sample["inputs"]), "-o", out, "--no-pack", "--json"],
                capture_output=True, text=True, timeout=1800)
            if proc.returncode != 0:
                rows.append({"sample": sample["name"], "error": (proc.stderr.strip().splitlines() or ["?"])[-2][:160]})
                continue
            summary = json.loads(proc.stdout)
            shapes = summary.get("shapes") or {}
            steps = {s["step"]: s["calls"] for s in summary["steps"]}
            rows.append({"sample": sample["name"], "kind": summary["signature"]["kind"],
                         "final_kind": summary["verdict"]["signature"]["kind"], "nodes": summary["minimal"]["nodes"],
                         "before": shapes.get("input_elements_before"), "after": shapes.get("input_elements_after"),
                         "shape_calls": steps.get("shapes", 0), "calls": summary["calls"]["target"],
                         "inputs": [f"{i['name']}{i['shape']}" for i in summary["minimal"]["inputs"]]})
            print(rows[-1], file=sys.stderr, flush=True)
    lines = ["| sample | kind (node-minimal → after shapes) | nodes | input elements before | after | ratio | "
             "shape calls | target calls in all | minimal inputs |", "|" + "---|" * 9]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['sample']} | error: {row['error']} | | | | | | | |")
            continue
        before, after = row["before"], row["after"]
        ratio = f"1/{before // after:,}" if before and after else "not shrunk"
        lines.append(f"| {row['sample']} | {row['kind']} → {row['final_kind']} | {row['nodes']} | "
                     f"{before if before else '—'} | {after if after else '—'} | {ratio} | {row['shape_calls']} | "
                     f"{row['calls']} | {', '.join(row['inputs'])} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "shapes.md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(ROOT, "bench", "results", "shapes.json"), "w") as handle:
        json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
