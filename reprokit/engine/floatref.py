"""The user's own float model as the quantization's reference (``--reference-model FLOAT.onnx``
on a quantized MODEL): where the derived fp32 twin (graph/quant.py: the Q/DQ pairs dropped) is
the model the quantization was made from only up to the weights' rounding and the quantizer's
rewrites, the float model the user quantized is the model itself.

It stands in for the twin wherever ``check`` measures the quantization's error (the cause line,
``--quant-reference fp32``). Inputs and outputs are matched by name, else by position where the
counts and shapes agree (a QAT export may rename them), and the match is said. ``shrink`` and
``pack`` compare with fake-quant only and refuse it (exit 2): there the float model has nothing
to answer. ``audit`` measures its calibration diagnosis against it.

Must not build candidates or print.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from reprokit.errors import InputError, UsageError
from reprokit.graph import quant
from reprokit.graph.io import load_model


@dataclass(frozen=True)
class FloatReference:
    """The user's float model, matched to the quantized one."""

    path: str
    inputs: dict  # quantized model's input name -> float model's input name
    outputs: dict  # quantized model's output name -> float model's output name
    note: str  # how they were matched (empty: every name the same)

    @property
    def label(self) -> str:
        return f"your float model {os.path.basename(self.path)}"

    def run(self, oracle, feeds: dict) -> tuple[dict | None, str]:
        """Its outputs on the reference engine, keyed by the quantized model's names (a failing
        run raises ReferenceFailure, as any reference run)."""
        mapped = {self.inputs[name]: value for name, value in feeds.items() if name in self.inputs}
        values = dict(oracle.run_reference(self.path, mapped).outputs)
        return {q: values[f] for q, f in self.outputs.items() if f in values}


def is_quantized_file(path: str) -> bool:
    """Does the ONNX file hold quantized ops (read without its weights)?"""
    return bool(quant.holds_quantized(load_model(os.fspath(path), load_weights=False)))


def refuse_outside_check(model_path: str, reference_model: str | None, command: str) -> None:
    """``shrink``/``pack`` of a quantized MODEL with --reference-model: usage error (exit 2)."""
    if reference_model and command != "check" and is_quantized_file(model_path):
        raise UsageError(
            f"--reference-model on a quantized model is for check: {command} compares the engine with "
            "fake-quant, the model's own Q/DQ semantics, where your float model has nothing to answer",
            hint=f"reprokit check MODEL --reference-model {reference_model} says whose divergence it is; "
            f"then reprokit {command} MODEL without --reference-model (docs/quantized.md)",
        )


def for_audit(model, float_path: str) -> FloatReference:
    """The float model audit's calibration diagnosis measures against; audit takes
    --reference-model only for a quantized MODEL (UsageError otherwise)."""
    if not quant.holds_quantized(model):
        raise UsageError(
            "audit takes --reference-model only for a quantized model (its float original, for the "
            "calibration diagnosis)",
            hint="reprokit shrink CONVERTED.onnx --reference-model FP32.onnx finds the node and the "
            "AutoCast exclusion that fixes it",
        )
    return match(model, float_path)


def match(quantized_model, float_path: str) -> FloatReference:
    """Match the float model's inputs and outputs to the quantized model's: by name, else by
    position with the same count and shapes; InputError (exit 3) when neither holds."""
    float_model = load_model(os.fspath(float_path), load_weights=False)
    if quant.holds_quantized(float_model):
        raise InputError(
            f"{float_path} holds quantized ops: it is no float model to compare the quantization with",
            hint="give the float model you quantized (the one quantize_static read), or drop --reference-model: "
            "check then derives the fp32 twin from MODEL",
        )
    notes = []
    inputs = _pair(
        _graph_inputs(quantized_model), _graph_inputs(float_model), "inputs", float_path, notes
    )
    outputs = _pair(
        _graph_outputs(quantized_model), _graph_outputs(float_model), "outputs", float_path, notes
    )
    return FloatReference(os.fspath(float_path), inputs, outputs, "; ".join(notes))


def _shape(value_info) -> tuple:
    dims = value_info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)


def _graph_inputs(model) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _graph_outputs(model) -> list:
    return list(model.graph.output)


def _pair(mine: list, theirs: list, what: str, path: str, notes: list) -> dict:
    names = {v.name for v in theirs}
    if all(v.name in names for v in mine):
        return {v.name: v.name for v in mine}
    if len(mine) == len(theirs) and all(_shape(a) == _shape(b) for a, b in zip(mine, theirs)):
        pairs = {a.name: b.name for a, b in zip(mine, theirs)}
        shown = ", ".join(f"{a} -> {b}" for a, b in list(pairs.items())[:4])
        notes.append(f"{what} matched by position ({shown})")
        return pairs
    raise InputError(
        f"{path}'s {what} ({', '.join(v.name for v in theirs)}) match the quantized model's "
        f"({', '.join(v.name for v in mine)}) neither by name nor by position and shape",
        hint="give the float model this model was quantized from",
    )
