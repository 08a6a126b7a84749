"""``--reference-model``: the user's fp32 model is the reference, the user's own converted
(explicit-precision) model is the target. Owns which targets can run a model as written (the
others refused with Error/Hint), the precision the criterion uses (the converted model's), and
wiring the oracle so that every target call runs the converted cut of what the reference runs
(:mod:`reprokit.convert.twin`). Must not judge verdicts.
"""

from __future__ import annotations

from reprokit.convert.twin import NotATwin, TargetModels, Twins, declared_precision, map_cut
from reprokit.errors import InputError, UsageError
from reprokit.graph.io import load_model, save_model
from reprokit.spec import TargetSpec

# target options that change the precision a model is built in: an explicit-precision model
# states its own, and one of these would build another engine than the user's
_RECAST = {
    "emulate": ("fp16", "bf16", "fp32-nodes"),
    "ort": ("fp16", "bf16", "fp32-nodes", "trt"),
    "openvino": ("bf16", "f16", "fp32-nodes"),
    "trt": ("fp16", "bf16", "int8", "fp8", "fp32-nodes"),
}
_AS_WRITTEN = {
    "emulate": "emulate:typed",
    "ort": "ort or ort:cuda",
    "openvino": "openvino:f32",
    "trt": "trt:strongly-typed (TensorRT 8.6-10; on 11 plain trt is strongly typed)",
}


def check_target(spec: TargetSpec) -> None:
    """Refuse a target that would not run the converted model as the user wrote it."""
    if spec.engine == "cmd":
        return
    changed = [o for o in _RECAST.get(spec.engine, ()) if spec.has(o)]
    if spec.engine == "emulate" and not spec.has("typed"):
        changed = changed or ["fp16"]
    if spec.engine == "openvino" and not spec.has("f32"):
        changed = changed or ["bf16 (its default)"]
    if changed:
        raise UsageError(
            f"--reference-model runs your converted model as written, but target {spec} changes its precision "
            f"({', '.join(changed)})",
            hint=f"use --target {_AS_WRITTEN.get(spec.engine, 'ort')}: the precision is in the converted model",
        )


def target_precision(path: str) -> str:
    """The precision of the converted model (fp16 or bf16), for the tolerance; refuses one with none."""
    model = load_model(path, load_weights=False)
    precision = declared_precision(model)
    if precision is None:
        raise InputError(
            f"{path} holds no fp16/bf16 tensor: it is not an explicit-precision model",
            hint="give the converted model as MODEL and its fp32 original as --reference-model",
        )
    return precision


def attach(oracle, fp32_model, fp32_path: str, converted_path: str) -> str:
    """Every target call of ``oracle`` runs the converted twin of the file it is given; returns
    the note that says so."""
    try:
        oracle.target_model = TargetModels(fp32_model, fp32_path, converted_path)
    except NotATwin as exc:
        raise InputError(
            f"{converted_path} is not a conversion of the --reference-model: {exc}",
            hint="the two must share node and tensor names, as AutoCast and onnxconverter-common keep "
            "them",
        ) from exc
    missing = oracle.target_model.twins.missing()
    if len(missing) == len(fp32_model.graph.node):
        raise InputError(
            f"no node of the --reference-model has a twin in {converted_path}",
            hint="the two must share node and tensor names",
        )
    note = f"--reference-model: the reference runs {fp32_path}, the target runs {converted_path} (its cuts as written)"
    if missing:
        note += f"; fp32 nodes with no twin there, run as in the fp32 model: {', '.join(missing)}"
    return note


def write_target_cut(fp32_path: str, converted_path: str, cut_path: str, out_path: str) -> str:
    """The converted twin of ``cut_path`` (a cut of ``fp32_path``), written to ``out_path``:
    what the archive's target runs beside the fp32 cut."""
    fp32 = load_model(fp32_path, load_weights=False)
    mapped = map_cut(Twins.build(fp32, load_model(converted_path)), load_model(cut_path))
    return save_model(mapped, out_path)
