"""The converted model an fp16/bf16 archive carries (``model.fp16.onnx``: the explicit-precision
model a strongly typed TensorRT or ort:cuda,fp16 builds, issue 36), written from the checked
model, or from the model file in a thread while pack's check runs. Judges nothing.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, wait

from reprokit.convert import convert_float_model_report
from reprokit.engine.background import in_background
from reprokit.graph.io import external_locations, inline_external_data, load_model, save_model
from reprokit.graph.model import name_unnamed_nodes
from reprokit.report.trtcommands import beyond_range


def converts(spec) -> bool:
    converted_by_reprokit = spec.engine in ("trt", "emulate") or (spec.engine == "ort" and spec.has("cuda"))
    return converted_by_reprokit and (spec.has("fp16") or spec.has("bf16"))


def early_conversion(model_path: str, spec, stage: str) -> Future | None:
    """The converted model written in a thread while pack's check runs: it needs the model file,
    not the verdict (a Swin window's 96 MB: ~2 s of conversion and saving, which the check's
    engine runs in worker processes leave a core for). Started only beside polygraphy's early
    runs, and kept or dropped with them (the check ran this very file, or it is made again)."""
    if not converts(spec):
        return None

    def convert() -> dict | None:
        model = load_model(model_path)  # weights read in: early runs only start on a self-contained file
        return write_conversion(stage, model, os.path.dirname(os.path.abspath(model_path)), spec)

    return in_background("convert", convert)


def settled(converting: Future | None) -> None:
    """Wait for an early conversion to end (its error, if any, is the normal path's to raise):
    nothing writes into the stage after pack leaves it."""
    if converting is not None:
        wait([converting])


def write_conversion(stage: str, model, base_dir: str, spec) -> dict | None:
    """The explicit-precision model a strongly typed TensorRT (or ort:cuda,fp16) builds; emulate
    archives carry it too, so a maintainer on TensorRT 11 can run them (issue 36)."""
    if not converts(spec):
        return None
    narrow = "fp16" if spec.has("fp16") else "bf16"
    keep = frozenset(n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip())
    inline = model  # the conversion copies it; a copy here only for what changes it in place
    if keep or external_locations(model):
        inline = inline_external_data(type(model).FromString(model.SerializeToString()), base_dir)
    if keep:  # fp32-nodes may name an unnamed node by its OP_INDEX label, as the engines read it
        name_unnamed_nodes(inline)
    converted, report = convert_float_model_report(inline, narrow, keep)
    save_model(converted, os.path.join(stage, f"model.{narrow}.onnx"))
    return {"schema_fp32": list(report.schema_fp32), "clamped": beyond_range(inline, narrow)}
