"""Side by side: reprokit's tested precision workaround against polygraphy's `debug precision`
bisection, on the same model, target, feeds and oracle.

- **reprokit**: each node alone fed with the reference activations (packed: the ranking), then
  the search over that ranking (``reprokit/shrink/precision.py``: packed prefix sizes and pruning
  on the emulator / ``ort:cuda``, bisection elsewhere), then one call of the printed setting;
- **reprokit, bisection**: the same ranking, bisected one call per size (what a non-packable
  engine gets), for the cost of packing vs not;
- **polygraphy bisect**: a reimplementation of ``BisectMarker`` (tools/Polygraphy/polygraphy/
  tools/debug/subtool/precision.py, ``--mode bisect --dir forward``): the first k layers in
  topological order kept in fp32, all of them first, one engine build per step, until good and
  bad are one apart. Its answer is "the first k layers".

Every call of every column goes through the same oracle and criterion; a set "agrees" when the
whole model, run with it, is within tolerance. Usage::

    python bench/bench_precision.py [--quick] [--json bench/results/precision.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from reprokit.api import RunOptions, make_oracle, prepare  # noqa: E402
from reprokit.audit import _capture  # noqa: E402
from reprokit.audit.calls import Ledger  # noqa: E402
from reprokit.graph.model import node_label, node_labels  # noqa: E402
from reprokit.shrink.pipeline import isolated_attribution  # noqa: E402
from reprokit.shrink.precision import Search, find_workaround, packable  # noqa: E402


def polygraphy_bisect(search: Search, layers: list[str]) -> dict:
    """polygraphy's BisectMarker, step for step: start with every layer marked; on success the
    good count drops (floor of the midpoint), on failure the bad count rises (ceil); stop when the
    count repeats or good and bad are one apart."""
    start = search.calls
    n = len(layers)
    good, bad, num = n + 1, 0, n
    while True:
        _, trial = search.alone(layers[:num])
        if trial.agrees:
            good, rounding = num, math.floor
        else:
            bad, rounding = num, math.ceil
        old, num = num, int(rounding((good + bad) / 2.0))
        if old == num or abs(good - bad) <= 1 or num > n:
            break
    found = good if good <= n else None
    error = None
    if found is not None:
        error = search.alone(layers[:found])[1].error  # cached: polygraphy built it already
    return {"calls": search.calls - start, "size": found, "error": error}


MODELS: list[str] = []  # --models: folders searched first (the device has no rapidocr)


def ocr_model(name: str) -> str | None:
    for folder in MODELS:
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", name)
    return path if os.path.exists(path) else None


def picture(work: str, name: str, height: int, width: int) -> str:
    """matplotlib's grace_hopper.jpg resized to HxW in [-1, 1], as bench_shrink feeds PP-OCR (made
    once here and carried where matplotlib is missing: --models DIR holds {name}.npz)."""
    for folder in MODELS:
        if os.path.exists(os.path.join(folder, f"{name}.npz")):
            return os.path.join(folder, f"{name}.npz")
    import matplotlib
    import matplotlib.image as mpimg
    import numpy as np

    image = mpimg.imread(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data",
                                      "grace_hopper.jpg")).astype(np.float32) / 255.0
    rows = (np.arange(height) * image.shape[0] / height).astype(int)
    cols = (np.arange(width) * image.shape[1] / width).astype(int)
    x = ((image[rows][:, cols] - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)
    path = os.path.join(work, f"{name}.npz")
    np.savez(path, x=x)
    return path


def cases(work: str, quick: bool, gpu: bool) -> list[dict]:
    import shrink_models as sm
    from test_precision import accumulating_mlp

    mlp = sm.save(accumulating_mlp(), os.path.join(work, "mlp24.onnx"))
    out = [{"name": "mlp24 (synthetic)", "path": mlp, "target": "emulate:bf16", "tol": 0.01}]
    if gpu:  # fp16 with TF32 off: with TF32 on, even every node kept in fp32 misses a 1e-3 tolerance
        out = [{"name": "mlp24 (synthetic)", "path": mlp, "target": "ort:cuda,fp16,no-tf32", "tol": 1e-3},
               {"name": "mlp24 (synthetic)", "path": mlp, "target": "ort:cuda,bf16", "tol": 0.01}]
    det, rec = ocr_model("ch_PP-OCRv4_det_infer.onnx"), ocr_model("ch_PP-OCRv4_rec_infer.onnx")
    targets = ["ort:cuda,fp16,no-tf32", "ort:cuda,bf16"] if gpu else ["emulate:bf16", "emulate:fp16", "openvino:bf16"]
    if quick:
        targets = targets[:1]
    for target in targets:
        if rec:
            out.append({"name": "PP-OCRv4 rec", "path": rec, "target": target, "shapes": {"x": (1, 3, 48, 320)},
                        "inputs": picture(work, "rec", 48, 320), "tol": 0.01 if "bf16" in target else 2e-3})
        if det:
            out.append({"name": "PP-OCRv4 det", "path": det, "target": target, "shapes": {"x": (1, 3, 320, 320)},
                        "inputs": picture(work, "det", 320, 320), "tol": None})
    return out


def run_case(case: dict, work: str, polygraphy: bool = True) -> dict:
    options = RunOptions(inputs=case.get("inputs"), input_shapes=case.get("shapes", {}), tolerance=case["tol"])
    started = time.monotonic()
    prepared = prepare(case["path"], options, work)
    oracle = make_oracle(case["target"], options, os.path.join(work, "calls"))
    oracle.weights_dir = prepared.base_dir
    ledger = Ledger()
    model, _, _, activations, reference, _ = _capture(oracle, ledger, prepared, work, [], lambda text: None)
    feeds = prepared.feeds.arrays
    verdict = oracle.verdict_from(oracle.run_target(prepared.path, feeds), reference)
    row = {"case": case["name"], "target": case["target"], "nodes": len(prepared.model.graph.node),
           "verdict": verdict.kind.value, "error": verdict.worst().error, "tolerance": verdict.criterion.tolerance}
    if not verdict.diverges:
        row["note"] = "agrees: nothing to search"
        return row
    before = oracle.stats.target
    isolated = isolated_attribution(model, activations, feeds, oracle, verdict.signature,
                                    os.path.join(work, "isolated"), lambda i: model.graph.node[i].name)
    row["ranking_calls"] = oracle.stats.target - before
    labels = node_labels(prepared.model)
    ranked = [n for n in isolated["ranking"] if n in labels]
    row["ranked"] = len(ranked)

    def search(pack: bool) -> Search:
        return Search(prepared.model, prepared.path, feeds, reference, case["target"],
                      lambda spec: make_oracle(spec, options, os.path.join(work, "calls")),
                      os.path.join(work, "search"), weights_dir=prepared.base_dir, pack=pack)

    ours = find_workaround(search(True), ranked)
    row["reprokit"] = {"method": ours.method, "calls": ours.calls, "size": len(ours.nodes), "agrees": ours.agrees,
                       "error": ours.error, "setting": ours.setting, "note": ours.note}
    if not polygraphy:  # the search alone (the test): no comparison columns
        return row
    if packable(case["target"]):
        plain = find_workaround(search(False), ranked)
        row["reprokit_bisection"] = {"calls": plain.calls, "size": len(plain.nodes), "agrees": plain.agrees,
                                     "error": plain.error}
    layers = [node_label(n, i) for i, n in enumerate(prepared.model.graph.node)]
    row["polygraphy"] = polygraphy_bisect(search(False), layers)
    row["wall_s"] = round(time.monotonic() - started, 1)
    return row


def _num(value) -> str:
    return "—" if value is None else (value if isinstance(value, str) else f"{value:.3g}")


def table(rows: list[dict]) -> str:
    lines = ["| model | target | nodes | error / tol | ranking calls | reprokit: calls (search+ranking), size, error as printed "
             "| reprokit bisection over the ranking: calls, size | polygraphy bisect: builds, first-k size, error |",
             "| --- | --- | ---: | --- | ---: | --- | --- | --- |"]
    for r in rows:
        if "reprokit" not in r:
            lines.append(f"| {r['case']} | {r['target']} | {r['nodes']} | {_num(r['error'])} / {_num(r['tolerance'])} "
                         f"| — | {r.get('note', r.get('failed', ''))} | — | — |")
            continue
        ours, poly, plain = r["reprokit"], r["polygraphy"], r.get("reprokit_bisection")
        total = ours["calls"] + r["ranking_calls"]
        answer = (f"{ours['calls']}+{r['ranking_calls']} = **{total}**, {ours['size']} nodes, "
                  f"{ours['setting'] and ('agree' if ours['agrees'] else 'DIVERGES')} {_num(ours['error'])}"
                  if ours["agrees"] else f"{total}: {ours['note'] or 'no agreeing set'}")
        lines.append(
            f"| {r['case']} | {r['target']} | {r['nodes']} | {_num(r['error'])} / {_num(r['tolerance'])} "
            f"| {r['ranking_calls']} | {answer} "
            f"| {(str(plain['calls'] + r['ranking_calls']) + ', ' + str(plain['size'])) if plain else '— (not packable: the column left is it)'} "
            f"| {poly['calls']}, {poly['size'] if poly['size'] is not None else 'none agrees'}, {_num(poly['error'])} |")
    return "\n".join(lines)



def run_rows(prefix: str, args, run_case, table, *, quick: bool, gpu: bool, failed=lambda case: {}) -> list:
    """Every case (``--only`` filters) through ``run_case``, a failed case a row saying why; the
    table printed and the rows written to ``--json``. Shared with bench_window.py."""
    rows = []
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        for number, case in enumerate(cases(work, quick, gpu)):
            if args.only and args.only not in f"{case['name']} {case['target']}":
                continue
            print(f"== {case['name']} {case['target']}", file=sys.stderr, flush=True)
            try:
                row = run_case(case, os.path.join(work, f"case{number}"))
            except Exception as exc:  # a bench row, not a crash: say what failed
                row = {"case": case["name"], "target": case["target"], **failed(case),
                       "failed": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(json.dumps(row, default=str), file=sys.stderr, flush=True)
            rows.append(row)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1, default=str)
    return rows

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one target per real model")
    parser.add_argument("--gpu", action="store_true", help="ort:cuda,fp16|bf16 instead of the CPU targets")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--only", help="substring of the case names to run")
    parser.add_argument("--models", action="append", default=[],
                        help="a folder holding the PP-OCRv4 models (and det.npz/rec.npz pictures)")
    args = parser.parse_args()
    MODELS.extend(args.models)
    run_rows("bench-precision-", args, run_case, table, quick=args.quick, gpu=args.gpu,
             failed=lambda case: {"nodes": "?", "error": None, "tolerance": case["tol"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
