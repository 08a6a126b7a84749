#!/usr/bin/env python
"""Quantized models side by side: for each model samples/make_quantized.py writes and each
target, the engine against fake-quant (in steps where the output is quantized), fake-quant
against the fp32 twin, the cause `check` names, the int8 ops the engine ran, and the seconds.

    python bench/quantized.py [--dir q/] [--targets openvino:f32,ort:opt] [--only mobilenetv2,vit]

Generates the models first when ``--dir`` holds none (needs transformers, torch, rapidocr).
The table in docs/quantized.md comes from it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "samples"))


def main(argv: list[str] | None = None) -> int:
    import make_quantized

    from reprokit.api import RunOptions, check

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(HERE.parent / "samples" / "quantized"))
    parser.add_argument("--targets", default="openvino:f32,ort:opt")
    parser.add_argument("--only", default=",".join(make_quantized.RECIPES))
    args = parser.parse_args(argv)
    rows = []
    for name in args.only.split(","):
        qdq = os.path.join(args.dir, f"{name}.qdq.onnx")
        if not os.path.exists(qdq):
            make_quantized.make(name, args.dir)
        inputs = os.path.join(args.dir, f"{name}.inputs.npz")
        for target in args.targets.split(","):
            started = time.monotonic()
            result = check(qdq, target, options=RunOptions(inputs=inputs))
            seconds = time.monotonic() - started
            error = result.verdict.outputs[0] if result.verdict.outputs else None
            attribution = result.quantized
            engine = "-" if error is None else f"{error.error:.3g} (rel-l2 {error.rel_l2:.3g})"
            twin = ", ".join(f"{v:.3g}" for v in attribution.quantization.values()) if attribution else "-"
            int8 = result.verdict.target_meta.get("int8_ops", "?")
            rows.append((name, target, str(int8), engine, twin, attribution.cause if attribution else "-",
                         f"{seconds:.1f}"))
    header = ("model", "target", "int8 ops", "engine vs fake-quant (steps)", "fake-quant vs twin", "cause", "s")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
