"""Quantization types as ONNX states them: which element type a QuantizeLinear/DequantizeLinear
quantizes to (int8, uint8, FP8 …), the float range a QuantizeLinear represents, FP8's relative
grid, and the constant values (scales, zero points) those are read from. graph/quant.py builds
units, steps, the twin and clipping on these facts.

Must not run engines or judge verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.standalone.compare import FLOAT8_FORMATS, grid_spacing

Q, DQ = "QuantizeLinear", "DequantizeLinear"


def constant_value(model, index, name: str):
    from onnx import numpy_helper

    if name in index.initializers:
        return numpy_helper.to_array(index.initializers[name])
    producer = index.producer.get(name)
    if producer is not None and model.graph.node[producer].op_type == "Constant":
        for attr in model.graph.node[producer].attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
    return None


def element_type(model, index, node) -> str:
    """The element type a QuantizeLinear/DequantizeLinear quantizes to ("int8", "uint8",
    "float8e4m3fn" …): its zero point's type, a Q's ``output_dtype`` (opset 21), a DQ's constant
    input's type; "uint8" (the spec's default) when none says."""
    from onnx import TensorProto

    if len(node.input) > 2 and node.input[2]:
        if node.input[2] in index.initializers:
            return TensorProto.DataType.Name(index.initializers[node.input[2]].data_type).lower()
        zero = constant_value(model, index, node.input[2])
        if zero is not None:
            return np.asarray(zero).dtype.name.replace("_", "")
    for attr in node.attribute:
        if attr.name == "output_dtype" and attr.i:
            return TensorProto.DataType.Name(attr.i).lower()
    if node.op_type == DQ and node.input[0] in index.initializers:
        return TensorProto.DataType.Name(index.initializers[node.input[0]].data_type).lower()
    return "uint8"


def qdq_types(model) -> frozenset[str]:
    """The element types the model's Q/DQ nodes quantize to (empty: no Q/DQ)."""
    index = Lookup.of(model)
    return frozenset(
        element_type(model, index, n) for n in model.graph.node if n.op_type in (Q, DQ)
    )


# FP8 formats: (largest finite value, mantissa bits, exponent of the smallest normal). Their grid
# is relative — the spacing near v is 2^(floor(log2 v) - mantissa bits) — so one "step" depends
# on the magnitude, unlike int8's uniform scale. The table and the spacing live in
# standalone/compare.py: repro.py embeds them, so an archive judges FP8 outputs as the CLI does.
FLOAT8 = FLOAT8_FORMATS


float8_spacing = grid_spacing  # the spacing of an FP8 format's grid at a magnitude (scale units)


_RANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int4": (-8, 7),
    "uint4": (0, 15),
    **{kind: (-top, top) for kind, (top, _, _) in FLOAT8.items()},
}


def q_range(model, index, node, rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The float range [lo, hi] a QuantizeLinear represents (per channel: arrays shaped to
    broadcast against an input of ``rank`` dims along its axis)."""
    scale = np.asarray(constant_value(model, index, node.input[1]), np.float32)
    zero = (
        constant_value(model, index, node.input[2])
        if len(node.input) > 2 and node.input[2]
        else None
    )
    kind = element_type(model, index, node)
    qmin, qmax = _RANGES.get(kind, (-128, 127))
    z = np.zeros_like(scale) if zero is None else np.asarray(zero).astype(np.float32)
    if scale.ndim == 1 and scale.size > 1 and rank:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * rank
        shape[axis % rank] = scale.size
        scale, z = scale.reshape(shape), z.reshape(shape)
    return (qmin - z) * scale, (qmax - z) * scale


@dataclass(frozen=True)
class Lookup:
    """The two facts constant_value reads (GraphIndex would import this module back)."""

    initializers: dict
    producer: dict

    @classmethod
    def of(cls, model) -> Lookup:
        graph = model.graph
        return cls(
            {t.name: t for t in graph.initializer},
            {o: i for i, node in enumerate(graph.node) for o in node.output if o},
        )
