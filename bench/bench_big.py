"""Big-model benchmark: a generated transformer-like model of 3,000+ nodes and ~3 GB of
external-data weights with a planted fp16 fault, shrunk by reprokit and by polygraphy's
``debug reduce`` (used as its docs say, with external-data flags), side by side.

    python bench/bench_big.py [--dir /tmp/reprokit-big] [--layers 20 --hidden 1792] [--skip-polygraphy]

Prints a Markdown table (and writes bench/results/big.{md,json}): target calls, wall time, peak
memory (the tool's largest process; for reprokit also its own process apart from the engine
workers), disk used (activations and everything else written), graph bookkeeping share of the
wall time, minimal model. Goals (issue 7): reprokit's own peak memory well under the model size
(about 2x the largest tensor set one step needs), bookkeeping under 10 % of the time.
The model is generated once into --dir and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import bench_shrink as common  # noqa: E402
from make_big_model import build  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "reprokit-big"))
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1792)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--skip-polygraphy", action="store_true")
    parser.add_argument("--step-timeout", type=float, default=3600)
    args = parser.parse_args(argv)
    model = os.path.join(args.dir, "model.onnx")
    marker = os.path.join(args.dir, "params.json")
    params = vars(args) | {"dir": None, "skip_polygraphy": None, "step_timeout": None}
    if not (os.path.exists(model) and os.path.exists(marker) and json.load(open(marker)) == params):
        started = time.monotonic()
        path, nodes, size = build(args.dir, args.layers, args.hidden, args.heads, args.seq, (2 * args.layers) // 3)
        json.dump(params, open(marker, "w"))
        print(f"generated {path}: {nodes} nodes, {size / 2**30:.2f} GiB in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
    nodes = common.model_nodes(model)[0]
    weights = os.path.getsize(os.path.join(args.dir, "weights.bin"))
    largest = 4 * args.hidden * 4 * args.hidden * 4  # the FF weight, bytes
    spec = {"name": f"transformer_{nodes}n_{weights / 2**30:.1f}GiB", "path": model, "target": "emulate:fp16",
            "tol": None, "shapes": {}, "inputs": None, "expected": "nonfinite", "sample": False,
            "step_timeout": args.step_timeout,
            # polygraphy's `surgeon sanitize` cannot save a model over 2 GB even with
            # --save-external-data (SaveOnnx calls ModelProto.ByteSize(): "EncodeError: Failed to
            # serialize proto", after 10.7 GB of RSS); this model is already static with nothing
            # to fold, so polygraphy gets it as it is, its weights read from the model's folder.
            "skip_sanitize": True,
            "polygraphy_extra": {"run_mark_all": ["--external-data-dir", args.dir],
                                 "reduce": ["--external-data-dir", args.dir, "--save-external-data", "reduced.data"]}}
    root = tempfile.mkdtemp(prefix="bench-big-")
    result = {"model": spec["name"], "nodes": nodes, "weights_gib": round(weights / 2**30, 2),
              "largest_weight_mib": round(largest / 2**20, 1)}
    feeds = common.prepare_feeds(spec, root)
    result["feeds"] = feeds
    print(f"original: {feeds['kind']}", file=sys.stderr)
    result["reprokit"] = common.run_reprokit(spec, feeds, os.path.join(root, "reprokit"))
    result["reprokit"]["disk_mib"] = common.dir_mib(os.path.join(root, "reprokit"))
    print(f"reprokit: {result['reprokit'].get('calls')} calls, {result['reprokit']['wall_s']:.0f} s", file=sys.stderr)
    if not args.skip_polygraphy:
        result["polygraphy"] = common.run_polygraphy(spec, feeds, os.path.join(root, "polygraphy"))
        result["polygraphy"]["disk_mib"] = common.dir_mib(os.path.join(root, "polygraphy"))
    text = render(result)
    print(text)
    os.makedirs(common.RESULTS, exist_ok=True)
    with open(os.path.join(common.RESULTS, "big.md"), "w") as handle:
        handle.write(text + "\n")
    with open(os.path.join(common.RESULTS, "big.json"), "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


def render(result: dict) -> str:
    lines = [f"Model: {result['model']} ({result['nodes']} nodes, {result['weights_gib']} GiB of external "
             f"weights, largest weight {result['largest_weight_mib']} MiB); target emulate:fp16; original "
             f"{result['feeds']['kind']}.", "",
             "| tool | target calls | wall (s) | peak RSS, largest process (MiB) | reprokit's own peak RSS (MiB) | "
             "disk: activations / all (MiB) | bookkeeping share | minimal nodes | minimal ops | kind kept |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for tool in ("reprokit", "polygraphy"):
        row = result.get(tool)
        if not row:
            continue
        res = row.get("resources") or {}
        lines.append(
            f"| {tool} | {row.get('calls', '—')} | {row['wall_s']:.0f} | {row['peak_mib']:.0f} | "
            f"{res.get('reprokit_peak_rss_mib', '—')} | {row.get('activations_mib', 0):.0f} / {row.get('disk_mib', 0):.0f} | "
            f"{res.get('bookkeeping_share', '—')} | {row.get('minimal_nodes', row.get('error', '—'))} | "
            f"{common.ops_text(row.get('minimal_ops') or [])} | {'yes' if row.get('kept') else 'no'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
