"""The onnxruntime-gpu suite of docs/gpu.md: emulator fidelity, and shrink/verify/audit on real
CUDA kernels. Run on the device by ``scripts/gpu-ort-suite.sh``; every step also runs here on
CPU targets (``--target emulate:fp16``), which is how the suite itself is tested.

    python bench/gpu_suite.py models   --extra DIR --out W/models          # W/models/manifest.json
    python bench/gpu_suite.py fidelity --manifest M --target ort:cuda,fp16 --target emulate:fp16 … --out W
    python bench/gpu_suite.py shrink   --manifest M --fidelity W/fidelity.json --target ort:cuda,fp16 --out W

``models`` writes every model of the suite with its feeds: the five samples, three planted cases
(bench/planted.py), PP-OCRv4 det and rec and YOLOv8n (files in --extra, fed a real picture:
matplotlib's grace_hopper.jpg), and networks exported from torchvision / timm where those are
installed (random weights, seed 0; a network that cannot be built or exported is listed with the
reason, never silently dropped).

``fidelity`` runs ``reprokit check --json`` for every model under every target (--jobs at a time)
and writes fidelity.json and fidelity.md: kind and worst rel-L2 per model and target, and for each
narrow type whether the emulator predicted the GPU kernels (same kind, rel-L2 within 2×).

``explain`` runs ``check --layerwise`` under both the kernels and the emulator wherever the
emulator did not predict the kernels, and writes explain.json (where each diverges first).

``keep`` checks every sample with ``fp32-nodes=`` its fault node alone and its catalog
``keep_fp32`` set, under each --target (keep.json, keep.md): what keeping nodes in fp32 does on
the kernels and in the emulator.

``shrink`` takes the models that diverge under the target in fidelity.json (at most --max), runs
``reprokit shrink`` then ``reprokit verify`` on the archive, and ``reprokit audit`` on the first
--audit of them; writes shrink.json and shrink.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def reprokit(*args: str, timeout: float = 600) -> tuple[int, str, str, float]:
    """``python -m reprokit ARGS``: exit code, stdout, stderr, seconds (exit 124 on timeout)."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "reprokit", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out, f"timed out after {timeout:.0f} s", time.monotonic() - start
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def first_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith(("Error", "Hint"))]
    return " ".join(lines)[:500] if lines else stderr.strip()[-500:]


# ------------------------------------------------------------------------------------------------
# models


def _picture(height: int, width: int, mean, std):
    """grace_hopper.jpg (matplotlib's sample data) resized (nearest) to HxW, (x - mean) / std, NCHW."""
    import matplotlib
    import matplotlib.image as mpimg
    import numpy as np

    image = mpimg.imread(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data",
                                      "grace_hopper.jpg")).astype(np.float32) / 255.0
    rows = (np.arange(height) * image.shape[0] / height).astype(int)
    cols = (np.arange(width) * image.shape[1] / width).astype(int)
    x = (image[rows][:, cols] - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
THIRD_PARTY = [
    # name, file in --extra, input name, NCHW shape, normalization (mean, std), origin
    ("ppocrv4_det", "ch_PP-OCRv4_det_infer.onnx", "x", (1, 3, 320, 320), ((0.5,) * 3, (0.5,) * 3),
     "rapidocr-onnxruntime 1.4.4"),
    ("ppocrv4_rec", "ch_PP-OCRv4_rec_infer.onnx", "x", (1, 3, 48, 320), ((0.5,) * 3, (0.5,) * 3),
     "rapidocr-onnxruntime 1.4.4"),
    ("yolov8n", "yolov8n_nudenet_320n.onnx", "images", (1, 3, 320, 320), ((0.0,) * 3, (1.0,) * 3),
     "nudenet 3.4.2 (320n.onnx)"),
]


def _torch_networks():
    """(name, origin, builder) for networks exported on the machine that runs the suite."""

    def torchvision_net(name):
        def build():
            import torchvision

            return getattr(torchvision.models, name)(weights=None), (1, 3, 224, 224)
        return build

    def timm_net(name):
        def build():
            import timm

            return timm.create_model(name, pretrained=False), (1, 3, 224, 224)
        return build

    return [("resnet18", "torchvision resnet18, random weights (seed 0)", torchvision_net("resnet18")),
            ("mobilenet_v3_small", "torchvision mobilenet_v3_small, random weights (seed 0)",
             torchvision_net("mobilenet_v3_small")),
            ("vit_tiny", "timm vit_tiny_patch16_224, random weights (seed 0)", timm_net("vit_tiny_patch16_224"))]


def _export(build, path: str) -> str:
    """Export the network to ``path`` (opset 17, input 'input'); returns the exporter used."""
    import torch

    torch.manual_seed(0)
    module, shape = build()
    module.eval()
    example = torch.from_numpy(_picture(shape[2], shape[3], *IMAGENET))
    errors = []
    for dynamo in (False, True):
        try:
            with torch.no_grad():
                torch.onnx.export(module, (example,), path, input_names=["input"], output_names=["logits"],
                                  opset_version=17 if not dynamo else 18, dynamo=dynamo)
            if dynamo:  # the dynamo exporter may keep weights beside the file: fold them in
                import onnx

                onnx.save(onnx.load(path), path)
            return f"torch {torch.__version__} torch.onnx.export(dynamo={dynamo})"
        except Exception as exc:  # noqa: BLE001 - the next exporter, then the reason in the manifest
            errors.append(f"dynamo={dynamo}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    raise RuntimeError("; ".join(errors))


def cmd_models(args) -> int:
    import numpy as np
    import onnx

    sys.path.insert(0, BENCH)
    import planted

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    manifest = []
    with open(os.path.join(ROOT, "samples", "catalog.json")) as handle:
        for sample in json.load(handle)["samples"]:
            manifest.append({"name": sample["name"], "origin": "reprokit sample",
                             "path": os.path.join(ROOT, "samples", sample["file"]),
                             "inputs": os.path.join(ROOT, "samples", sample["inputs"])})
    for name, make in (("planted_blocks", planted.blocks), ("planted_l2norm", planted.l2norm),
                       ("planted_two_faults", planted.two_faults)):
        path, inputs = planted.save(*make(), out, name)
        manifest.append({"name": name, "origin": "bench/planted.py", "path": path, "inputs": inputs})
    for name, filename, input_name, shape, (mean, std), origin in THIRD_PARTY:
        source = os.path.join(args.extra, filename) if args.extra else ""
        if not os.path.exists(source):
            manifest.append({"name": name, "origin": origin, "skipped": f"{filename} not in --extra"})
            continue
        inputs = os.path.join(out, f"{name}.npz")
        np.savez(inputs, **{input_name: _picture(shape[2], shape[3], mean, std)})
        manifest.append({"name": name, "origin": origin, "path": source, "inputs": inputs,
                         "input_shapes": [f"{input_name}:{'x'.join(map(str, shape))}"]})
    for name, origin, build in _torch_networks():
        path = os.path.join(out, f"{name}.onnx")
        try:
            exporter = _export(build, path)
        except Exception as exc:  # noqa: BLE001 - said in the manifest and the tables
            manifest.append({"name": name, "origin": origin, "skipped": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        inputs = os.path.join(out, f"{name}.npz")
        np.savez(inputs, input=_picture(224, 224, *IMAGENET))
        manifest.append({"name": name, "origin": f"{origin}; {exporter}", "path": path, "inputs": inputs})
    for entry in manifest:
        if "path" in entry:
            model = onnx.load(entry["path"], load_external_data=False)
            entry["nodes"] = len(model.graph.node)
    with open(os.path.join(out, "manifest.json"), "w") as handle:
        json.dump(manifest, handle, indent=1)
    for entry in manifest:
        print(f"{entry['name']:24} {entry.get('nodes', '-'):>5}  {entry.get('skipped') or entry['origin']}")
    return 0


def _save(folder: str, name: str, data) -> None:
    """Write as it goes: a step killed at its time limit leaves what it found."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as handle:
        json.dump(data, handle, indent=1)


def _load_manifest(path: str) -> list[dict]:
    with open(path) as handle:
        return json.load(handle)


def _common(entry: dict) -> list[str]:
    args = ["--inputs", entry["inputs"]]
    for shapes in entry.get("input_shapes", []):
        args += ["--input-shapes", shapes]
    return args


# ------------------------------------------------------------------------------------------------
# fidelity


def check_cell(entry: dict, target: str, timeout: float) -> dict:
    code, out, err, seconds = reprokit("check", "--json", entry["path"], "--target", target, *_common(entry),
                                       timeout=timeout)
    cell = {"model": entry["name"], "target": target, "exit": code, "seconds": round(seconds, 1)}
    if code not in (0, 1):
        cell["error"] = first_error(err)
        return cell
    verdict = json.loads(out)["verdict"]
    outputs = verdict.get("outputs") or []
    worst = max(outputs, key=lambda o: float(o["rel_l2"]), default=None)
    cell.update(kind=verdict["signature"]["kind"], detail=verdict["signature"].get("detail"),
                rel_l2=float(worst["rel_l2"]) if worst else None, tol=verdict.get("tol"),
                nonfinite=sum(int(o.get("target_nan", 0)) + int(o.get("target_inf", 0)) for o in outputs),
                outputs={o["name"]: float(o["rel_l2"]) for o in outputs})
    meta = verdict.get("target_meta") or {}
    if meta.get("provider"):
        gpu = meta.get("gpu") or {}
        cell["gpu"] = {"provider": meta.get("provider"), "name": gpu.get("name"),
                       "compute_capability": gpu.get("compute_capability"), "driver": gpu.get("driver"),
                       "onnxruntime_build": meta.get("onnxruntime_build"),
                       "cuda_runtime_loaded": meta.get("cuda_runtime_loaded"),
                       "cudnn_loaded": meta.get("cudnn_loaded"), "tf32": meta.get("tf32")}
    if meta.get("converted_to"):
        cell["converted"] = {"schema_fp32_first": meta.get("schema_fp32"), "casts": meta.get("casts"),
                             "no_kernel_fp32": meta.get("no_kernel_fp32"), "notes": meta.get("notes")}
    return cell


def _fmt(cell: dict | None) -> str:
    if cell is None:
        return ""
    if "error" in cell:
        return f"exit {cell['exit']}"
    rel = cell.get("rel_l2")
    text = "nan" if rel is None else (f"{rel:.2g}" if rel == rel else "nan")
    if cell.get("nonfinite"):
        text += f", {cell['nonfinite']} NaN/Inf"
    return f"**{cell['kind']}** {text}" if cell["kind"] != "agree" else f"agree {text}"


def predicted(real: dict | None, emulated: dict | None) -> str:
    """'yes' when the emulator gave the kernels' kind and a rel-L2 within 2x (both tiny counts)."""
    if not real or not emulated or "error" in real or "error" in emulated:
        return "n/a"
    if real["kind"] != emulated["kind"]:
        return f"no: kind {emulated['kind']} vs {real['kind']}"
    a, b = real.get("rel_l2"), emulated.get("rel_l2")
    if a is None or b is None or a != a or b != b or a == float("inf") or b == float("inf"):
        return "yes (kind)"
    floor = 1e-6  # below this both are rounding noise of the same size
    if max(a, b) <= floor or max(a, b) <= 2 * max(min(a, b), floor):
        return "yes"
    return f"no: rel-L2 ×{max(a, b) / max(min(a, b), floor):.3g}"


def kept_like_the_kernels(entry: dict, narrow: str, cell: dict | None) -> list[str]:
    """The nodes the converted model ran in float32 on the GPU (their opset allows no narrow type,
    or onnxruntime had no narrow kernel for their op type): the emulator keeps the same ones for
    the 'kept' column."""
    import onnx

    from reprokit.convert import convert_float_model_report
    from reprokit.graph.model import name_unnamed_nodes

    if not cell or "error" in cell or not cell.get("converted"):
        return []
    model = onnx.load(entry["path"])
    name_unnamed_nodes(model)
    _, report = convert_float_model_report(model, narrow)
    types = set(((cell["converted"] or {}).get("no_kernel_fp32") or {}).get("op_types") or [])
    names = set(report.schema_fp32) | {node.name for node in model.graph.node if node.op_type in types}
    return sorted(n for n in names if n and not any(c in n for c in ",;="))


def _run_cells(jobs, args, cells, extra_targets=()) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(check_cell, e, t, args.timeout): (e, t, label) for e, t, label in jobs}
        for future in concurrent.futures.as_completed(futures):
            cell = future.result()
            label = futures[future][2]
            if label:
                cell["target"], cell["spec"] = label, cell["target"]
            cells.append(cell)
            _save(args.out, "fidelity.json", {"targets": list(args.target) + list(extra_targets),
                                              "models": _load_manifest(args.manifest), "cells": cells,
                                              "partial": True})
            print(f"{cell['model']:24} {cell['target']:18} exit {cell['exit']} {cell['seconds']:6.1f}s "
                  f"{_fmt(cell) if 'error' not in cell else cell['error'][:160]}", flush=True)


def cmd_fidelity(args) -> int:
    entries = [e for e in _load_manifest(args.manifest) if "path" in e]
    if args.only:
        entries = [e for e in entries if e["name"] in args.only]
    cells: list[dict] = []
    _run_cells([(e, t, None) for e in entries for t in args.target], args, cells)
    extra = []
    if args.matched:  # the emulator keeping in fp32 what the GPU run kept
        by = {(c["model"], c["target"]): c for c in cells}
        jobs = []
        for narrow in ("fp16", "bf16"):
            if f"ort:cuda,{narrow}" not in args.target:
                continue
            extra.append(f"emulate:{narrow} kept")
            for entry in entries:
                names = kept_like_the_kernels(entry, narrow, by.get((entry["name"], f"ort:cuda,{narrow}")))
                if names:
                    jobs.append((entry, f"emulate:{narrow},fp32-nodes={';'.join(names)}", f"emulate:{narrow} kept"))
        _run_cells(jobs, args, cells, extra)
    targets = list(args.target) + extra
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fidelity.json"), "w") as handle:
        json.dump({"targets": targets, "models": _load_manifest(args.manifest), "cells": cells}, handle,
                  indent=1)
    table = fidelity_table(_load_manifest(args.manifest), targets, cells)
    with open(os.path.join(args.out, "fidelity.md"), "w") as handle:
        handle.write(table)
    print(table)
    return 0


def fidelity_table(manifest: list[dict], targets: list[str], cells: list[dict]) -> str:
    by = {(c["model"], c["target"]): c for c in cells}
    pairs = [(narrow, f"ort:cuda,{narrow}", f"emulate:{narrow}") for narrow in ("fp16", "bf16")
             if f"ort:cuda,{narrow}" in targets and f"emulate:{narrow}" in targets]
    pairs += [(f"{narrow} (kept)", f"ort:cuda,{narrow}", f"emulate:{narrow} kept") for narrow in ("fp16", "bf16")
              if f"emulate:{narrow} kept" in targets]
    head = ["model", "nodes"] + [f"`{t}`" for t in targets] + [f"emulator predicts {n}" for n, _, _ in pairs]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for entry in manifest:
        if "path" not in entry:
            lines.append(f"| {entry['name']} | | not run: {entry.get('skipped', '')[:120]} |")
            continue
        row = [entry["name"], str(entry.get("nodes", ""))] + [_fmt(by.get((entry["name"], t))) for t in targets]
        row += [predicted(by.get((entry["name"], real)), by.get((entry["name"], emu)) or
                          (by.get((entry["name"], emu.replace(" kept", ""))) if emu.endswith(" kept") else None))
                for _, real, emu in pairs]
        lines.append("| " + " | ".join(row) + " |")
    errors = [c for c in cells if "error" in c]
    if errors:
        lines.append("")
        lines += [f"- {c['model']} `{c['target']}`: exit {c['exit']}: {c['error'][:300]}" for c in errors]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# shrink, verify, audit


def shrink_one(entry: dict, target: str, out: str, audit: bool, timeout: float) -> dict:
    folder = os.path.join(out, f"shrink-{entry['name']}")
    shutil.rmtree(folder, ignore_errors=True)
    code, _, err, seconds = reprokit("shrink", entry["path"], "--target", target, *_common(entry), "-o", folder,
                                     timeout=timeout)
    row = {"model": entry["name"], "target": target, "exit": code, "seconds": round(seconds, 1)}
    summary_path = os.path.join(folder, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as handle:
            summary = json.load(handle)
        minimal = summary.get("minimal") or {}
        row.update(status=summary.get("status"), nodes=summary.get("original", {}).get("nodes"),
                   minimal_nodes=minimal.get("nodes"), ops=minimal.get("ops"),
                   signature=(summary.get("signature") or {}).get("kind"),
                   calls=(summary.get("calls") or {}).get("target"), one_minimal=summary.get("one_minimal"))
    if code != 0:
        row["error"] = first_error(err)
    archive = os.path.join(folder, "report.tar.gz")
    if os.path.exists(archive):
        vcode, vout, verr, vseconds = reprokit("verify", archive, timeout=timeout)
        row.update(verify_exit=vcode, verify=(vout.strip().splitlines() or [""])[-1][:200],
                   verify_seconds=round(vseconds, 1))
    if audit:
        acode, aout, aerr, aseconds = reprokit("audit", entry["path"], "--target", target, *_common(entry), "-o",
                                               os.path.join(out, f"audit-{entry['name']}"), timeout=timeout)
        row.update(audit_exit=acode, audit_seconds=round(aseconds, 1),
                   audit=[line.strip() for line in aout.splitlines()
                          if line.strip().startswith(("workaround", "explain", "calls", "culprit", "verdict"))]
                   if acode == 0 else first_error(aerr))
    return row


def cmd_shrink(args) -> int:
    manifest = [e for e in _load_manifest(args.manifest) if "path" in e]
    with open(args.fidelity) as handle:
        cells = {(c["model"], c["target"]): c for c in json.load(handle)["cells"]}
    chosen = [e for e in manifest if (cells.get((e["name"], args.target)) or {}).get("kind") not in (None, "agree")]
    if args.only:
        chosen = [e for e in chosen if e["name"] in args.only]
    chosen = chosen[:args.max]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(shrink_one, e, args.target, args.out, i < args.audit, args.timeout)
                   for i, e in enumerate(chosen)]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            rows.append(row)
            _save(args.out, "shrink.json", rows)
            print(json.dumps(row), flush=True)
    rows.sort(key=lambda r: [e["name"] for e in chosen].index(r["model"]))
    with open(os.path.join(args.out, "shrink.json"), "w") as handle:
        json.dump(rows, handle, indent=1)
    lines = ["| model | nodes | minimal | ops | calls | seconds | verify | audit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verify = {1: "reproduces", 0: "does not reproduce"}.get(r.get("verify_exit"), f"exit {r.get('verify_exit')}")
        audit = "" if "audit_exit" not in r else f"exit {r['audit_exit']}, {r['audit_seconds']} s"
        if r.get("error"):
            lines.append(f"| {r['model']} | {r.get('nodes', '')} | exit {r['exit']}: {r['error'][:150]} | | "
                         f"{r.get('calls', '')} | {r['seconds']} | {verify if 'verify_exit' in r else ''} | {audit} |")
            continue
        lines.append(f"| {r['model']} | {r['nodes']} | {r['minimal_nodes']} | {', '.join(r['ops'] or [])} | "
                     f"{r['calls']} | {r['seconds']} | {verify} | {audit} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "shrink.md"), "w") as handle:
        handle.write(table)
    print(table)
    return 0


def cmd_explain(args) -> int:
    """Layerwise comparisons where the emulator did not predict the kernels: where each diverges first."""
    manifest = {e["name"]: e for e in _load_manifest(args.manifest) if "path" in e}
    with open(args.fidelity) as handle:
        cells = {(c["model"], c["target"]): c for c in json.load(handle)["cells"]}
    jobs = []
    for name, entry in manifest.items():
        for narrow in ("fp16", "bf16"):
            real, emulated = f"ort:cuda,{narrow}", f"emulate:{narrow}"
            verdict = predicted(cells.get((name, real)), cells.get((name, emulated)))
            if verdict.startswith("no"):
                jobs += [(entry, real, verdict), (entry, emulated, verdict)]
    rows = []

    def one(job):
        entry, target, verdict = job
        code, out, err, seconds = reprokit("check", "--json", "--layerwise", "--top", "5", entry["path"], "--target",
                                           target, *_common(entry), timeout=args.timeout)
        row = {"model": entry["name"], "target": target, "fidelity": verdict, "exit": code, "seconds": round(seconds, 1)}
        if code in (0, 1):
            found = json.loads(out)
            row["layerwise"] = found.get("layerwise")
        else:
            row["error"] = first_error(err)
        return row

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(one, jobs):
            rows.append(row)
            _save(args.out, "explain.json", rows)
            first = (row.get("layerwise") or {}).get("first")
            print(f"{row['model']:24} {row['target']:16} {row['fidelity']:28} first: "
                  f"{json.dumps(first)[:300] if first else row.get('error', '-')}", flush=True)
    with open(os.path.join(args.out, "explain.json"), "w") as handle:
        json.dump(rows, handle, indent=1)
    return 0


def cmd_keep(args) -> int:
    """fp32-nodes on the kernels and in the emulator: each sample's fault node alone, then the
    catalog's keep_fp32 set (the fault node with the readers that bring its values back in range)."""
    with open(os.path.join(ROOT, "samples", "catalog.json")) as handle:
        catalog = json.load(handle)["samples"]
    jobs = []
    for sample in catalog:
        entry = {"name": sample["name"], "path": os.path.join(ROOT, "samples", sample["file"]),
                 "inputs": os.path.join(ROOT, "samples", sample["inputs"])}
        for label, nodes in (("fault node", [sample["fault_node"]]), ("keep_fp32", sample["keep_fp32"])):
            for target in args.target:
                jobs.append((entry, f"{target},fp32-nodes={';'.join(nodes)}", f"{target} | {label}"))
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(check_cell, e, t, args.timeout): label for e, t, label in jobs}
        for future in concurrent.futures.as_completed(futures):
            cell = future.result()
            cell["label"] = futures[future]
            rows.append(cell)
            _save(args.out, "keep.json", rows)
            print(f"{cell['model']:24} {cell['label']:32} {_fmt(cell) if 'error' not in cell else cell['error'][:200]}",
                  flush=True)
    labels = [f"{t} | {k}" for k in ("fault node", "keep_fp32") for t in args.target]
    by = {(r["model"], r["label"]): r for r in rows}
    lines = ["| sample | " + " | ".join(f"`{label.split(' | ')[0]}` {label.split(' | ')[1]}" for label in labels) + " |",
             "| --- | " + " | ".join("---" for _ in labels) + " |"]
    for sample in catalog:
        lines.append(f"| {sample['name']} | " + " | ".join(_fmt(by.get((sample["name"], label))) for label in labels)
                     + " |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "keep.md"), "w") as handle:
        handle.write(table)
    print(table)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, jobs: int, timeout: float, *, manifest: bool = True, fidelity: bool = False):
        found = sub.add_parser(name)
        if manifest:
            found.add_argument("--manifest", required=True)
        if fidelity:
            found.add_argument("--fidelity", required=True)
        found.add_argument("--jobs", type=int, default=jobs)
        found.add_argument("--timeout", type=float, default=timeout)
        found.add_argument("--out", required=True)
        return found

    models = sub.add_parser("models")
    models.add_argument("--extra", default="", help="folder with the third-party .onnx files")
    models.add_argument("--out", required=True)
    fidelity = command("fidelity", 4, 300)
    fidelity.add_argument("--target", action="append", required=True)
    fidelity.add_argument("--only", action="append")
    fidelity.add_argument("--matched", action="store_true",
                          help="also the emulator keeping in fp32 what the GPU run kept (column 'emulate:X kept')")
    shrink = command("shrink", 3, 400, fidelity=True)
    shrink.add_argument("--target", required=True)
    shrink.add_argument("--only", action="append")
    shrink.add_argument("--max", type=int, default=6)
    shrink.add_argument("--audit", type=int, default=2)
    command("explain", 4, 300, fidelity=True)
    keep = command("keep", 6, 240, manifest=False)
    keep.add_argument("--target", action="append", required=True)
    args = parser.parse_args()
    commands = {"models": cmd_models, "fidelity": cmd_fidelity, "shrink": cmd_shrink, "explain": cmd_explain,
                "keep": cmd_keep}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
