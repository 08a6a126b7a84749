"""Print the verdict of `reprokit check` on every sample under each CPU target, as Markdown.

    python bench/check_samples.py [--targets emulate:fp16,openvino:bf16]

Each cell is one `reprokit check --json` run (the sample's bundled inputs): kind and the worst
output's relative L2 error / NaN+Inf counts. Used for docs/check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check(model: str, inputs: str, target: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "reprokit", "check", model, "--target", target,
                           "--inputs", inputs, "--json"], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        return f"error (exit {proc.returncode}): {proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else ''}"
    verdict = json.loads(proc.stdout)["verdict"]
    worst = max(verdict["outputs"], key=lambda o: float(o["rel_l2"]), default=None)
    kind = verdict["signature"]["kind"]
    if worst is None:
        return kind
    nonfinite = sum(o["target_nan"] + o["target_inf"] for o in verdict["outputs"])
    detail = f"rel L2 {float(worst['rel_l2']):.3g}" + (f", {nonfinite} NaN/Inf" if nonfinite else "")
    return f"**{kind}** ({detail})" if kind != "agree" else f"agree ({detail})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", default="emulate:fp16,openvino:bf16")
    args = parser.parse_args()
    targets = args.targets.split(",")
    with open(os.path.join(ROOT, "samples", "catalog.json")) as handle:
        catalog = json.load(handle)["samples"]
    print("| sample | nodes | planted fault | " + " | ".join(f"`{t}`" for t in targets) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in targets) + " |")
    for sample in catalog:
        model = os.path.join(ROOT, "samples", sample["file"])
        inputs = os.path.join(ROOT, "samples", sample["inputs"])
        cells = [check(model, inputs, t) for t in targets]
        print(f"| {sample['name']} | {sample['nodes']} | `{sample['fault_node']}` ({sample['fault_op']}) | "
              + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
