"""float32 → fp16/bf16 ONNX conversion: the model a strongly typed engine needs to compute narrow.

Strongly typed TensorRT (≥ 11, TensorRT-RTX, or ``strongly-typed``) has no FP16/BF16 builder
flags: it computes in the types the ONNX file states. This module rewrites a copy of a model so
its float arithmetic is narrow, while what a caller feeds and reads stays float32:

- float32 initializers, Constant values and type-picking attributes (Cast ``to``,
  ConstantOfShape ``value``, Random* / EyeLike / Bernoulli ``dtype``) become narrow; finite
  values past the narrow range are clamped to its maximum, as TensorRT does with weights;
- float graph inputs/outputs keep float32, with a Cast right after each input and right before
  each output (the producer's tensor is renamed ``NAME__rk_fp16``; the output keeps ``NAME``);
- nodes named in ``keep_fp32`` compute in float32 between Casts, reading exact float32 copies
  of their weights;
- an op input or output whose ONNX schema, at the model's opset, does not accept the narrow type
  (Resize ``scales``, QuantizeLinear/DequantizeLinear scales before opset 19, most ops in bf16
  before opset 22...) keeps float32: a Cast bridges it, or the whole node stays float32 when its
  output cannot be narrow (such nodes are listed in the report).

Opset, ir_version, node names and the names of all other tensors are kept. The model must have
its external data loaded. Must not run an engine, and must not touch non-float tensors.

The work is split by concern: :mod:`~reprokit.convert.planning` decides each tensor's precision,
:mod:`~reprokit.convert.casts` writes the Casts and narrow values, :mod:`~reprokit.convert.scopes`
knows subgraph scopes (names read from enclosing graphs), :mod:`~reprokit.convert.values` the types
and value rounding; this module drives them over the main graph and every body.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from reprokit.convert.casts import CastWriter
from reprokit.convert.planning import TypePlan
from reprokit.convert.scopes import Scope
from reprokit.convert.values import NARROW, NARROW_TYPES, WIDE
from reprokit.graph.index import bodies, node_names, rename_outer_refs
from reprokit.standalone.names import FreshNames

__all__ = ["ConversionReport", "convert_float_model", "convert_float_model_report", "node_names"]


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert_float_model_report` did besides the plain type change."""

    to: str
    kept_fp32: tuple[str, ...]  # nodes kept in float32 because the caller asked
    schema_fp32: tuple[str, ...]  # kept in float32: their schema refuses narrow, or local function
    casts: int  # Cast nodes inserted


def convert_float_model(
    model: onnx.ModelProto, to: str, keep_fp32: set[str] | frozenset[str] = frozenset()
) -> onnx.ModelProto:
    """Return a copy of ``model`` computing in ``to`` ("fp16" or "bf16"), float32 I/O kept."""
    return convert_float_model_report(model, to, keep_fp32)[0]


def convert_float_model_report(
    model: onnx.ModelProto, to: str, keep_fp32: set[str] | frozenset[str] = frozenset()
) -> tuple[onnx.ModelProto, ConversionReport]:
    """Like :func:`convert_float_model`, with a report; ValueError on an unknown node name."""
    if to not in NARROW_TYPES:
        raise ValueError(f"cannot convert to {to!r}: choose one of {', '.join(NARROW_TYPES)}")
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    keep_fp32 = frozenset(n for n in keep_fp32 if n)  # "" would match every unnamed node
    missing = sorted(keep_fp32 - set(node_names(converted.graph)))
    if missing:
        raise ValueError(f"no node named {', '.join(map(repr, missing))} in the model")
    plan = TypePlan(converted, NARROW_TYPES[to], keep_fp32, FreshNames(node_names(converted.graph)))
    writer = CastWriter(plan)
    _convert_graph(plan, writer, converted.graph, io_wide=True)
    report = ConversionReport(
        to=to,
        kept_fp32=tuple(sorted(keep_fp32)),
        schema_fp32=tuple(plan.schema_fp32),
        casts=writer.casts,
    )
    return converted, report


def _convert_graph(plan: TypePlan, writer: CastWriter, graph, io_wide: bool) -> None:
    """Convert one scope, then its bodies; ``io_wide``: its inputs/outputs stay float32 (the
    main graph), a body's are narrow."""
    scope = Scope(graph, WIDE if io_wide else NARROW)
    scope.outputs = [o.name for o in graph.output if plan.is_float(o.name)]
    plans = [plan.plan(scope, node) for node in graph.node]
    for name in scope.outputs:
        scope.needs[name].add(scope.io)
    plan.assign(scope, plans)
    renames = writer.keep_output_names(scope)
    for node, (_, wants, implicit) in zip(graph.node, plans, strict=True):
        for index, want in enumerate(wants):
            name = node.input[index]
            if want and plan.domain.get(name, want) != want:
                node.input[index] = writer.converted(scope, name, want)
        for name in (renames.get(n, n) for n in implicit):
            if plan.domain.get(name, NARROW) != NARROW:
                new = writer.converted(scope, name, NARROW)
                for sub in bodies(node):
                    rename_outer_refs(sub, {name: new})
    writer.retype(scope, io_wide)
    scope.rebuild()
    for node in graph.node:
        for sub in bodies(node):
            _convert_graph(plan, writer, sub, io_wide=False)
