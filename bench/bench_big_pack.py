"""Big-model archive benchmark (issue 37): a model with more than 2 GB of weights is packed,
its archive's own repro.py is run from the extracted folder, and ``reprokit verify`` reads the
archive; each step's wall time and peak memory (the largest process of its tree) side by side.

    python bench/bench_big_pack.py [--dir /tmp/reprokit-big-pack] [--width 8192 --layers 9]

The model: x[1,W] -> MatMul W0 -> ... -> MatMul W(L-2) (entries in [0, 2/W): values stay near
0.5) -> MatMul "boom" (every entry 4e5/W: about 2e5, past fp16's 65504) -> y. Its weights are
written straight into one external data file, one layer at a time, so making it needs no more
memory than one layer. Prints a Markdown table; writes bench/results/big_pack.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))


def build(folder: str, width: int, layers: int) -> str:
    """model.onnx + weights.bin in ``folder`` (reused when present); the model's path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    path = os.path.join(folder, "model.onnx")
    if os.path.exists(path):
        return path
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    inits, nodes, offset = [], [], 0
    with open(os.path.join(folder, "weights.bin"), "wb") as data:
        for layer in range(layers):
            last = layer == layers - 1
            weight = (
                np.full((width, width), 4e5 / width, np.float32)
                if last
                else rng.uniform(0, 2 / width, (width, width)).astype(np.float32)
            )
            data.write(weight.tobytes())
            tensor = helper.make_tensor_value_info(f"w{layer}", TensorProto.FLOAT, [width, width])
            init = onnx.TensorProto(
                name=f"w{layer}", data_type=TensorProto.FLOAT, dims=[width, width]
            )
            init.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", "weights.bin"),
                ("offset", str(offset)),
                ("length", str(weight.nbytes)),
            ):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            offset += weight.nbytes
            inits.append(init)
            del tensor, weight
            source = "x" if layer == 0 else f"h{layer - 1}"
            nodes.append(
                helper.make_node(
                    "MatMul",
                    [source, f"w{layer}"],
                    ["y" if last else f"h{layer}"],
                    name="boom" if last else f"mm{layer}",
                )
            )
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with open(path, "wb") as handle:
        handle.write(model.SerializeToString())
    return path


def timed(args: list[str], cwd: str) -> dict:
    """Run ``args``; exit code, wall seconds, and the peak resident memory of its process tree
    (wait4's rusage: the largest of the process and its waited-for descendants)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
        "tail": output.strip().splitlines()[-3:],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "reprokit-big-pack"))
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=9)
    parser.add_argument("--target", default="emulate:fp16")
    args = parser.parse_args(argv)
    model = build(os.path.join(args.dir, "model"), args.width, args.layers)
    weights = os.path.getsize(os.path.join(args.dir, "model", "weights.bin"))
    exe = os.path.join(os.path.dirname(sys.executable), "reprokit")
    work = os.path.join(args.dir, "run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rows = {"pack": timed([exe, "pack", model, "-t", args.target, "-o", "report.tar.gz"], work)}
    archive = os.path.join(work, "report.tar.gz")
    rows["archive"] = {"bytes": os.path.getsize(archive) if os.path.exists(archive) else 0}
    if os.path.exists(archive):
        extracted = os.path.join(work, "extracted")
        with tarfile.open(archive) as tar:
            tar.extractall(extracted, filter="data")
        folder = os.path.join(extracted, os.listdir(extracted)[0])
        rows["members"] = sorted(os.listdir(folder))
        rows["repro.py"] = timed([sys.executable, "repro.py"], folder)
        rows["verify"] = timed([exe, "verify", archive], work)
    lines = [
        f"model: {args.layers} MatMul layers of {args.width}x{args.width} fp32, {weights / 2**30:.2f} GiB of "
        f"external weights; target {args.target}; archive {rows['archive']['bytes'] / 2**30:.2f} GiB",
        "",
        "| step | exit | wall s | peak memory (GiB, largest process) |",
        "| --- | --- | --- | --- |",
    ]
    for step in ("pack", "repro.py", "verify"):
        if step in rows:
            row = rows[step]
            lines.append(f"| {step} | {row['exit']} | {row['wall_s']} | {row['peak_rss_gib']} |")
    table = "\n".join(lines)
    print(table)
    results = os.path.join(BENCH, "results")
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "big_pack.md"), "w") as handle:
        handle.write(table + "\n")
    with open(os.path.join(results, "big_pack.json"), "w") as handle:
        json.dump({"weights_bytes": weights, **rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
