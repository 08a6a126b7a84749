"""Quantized models (Q/DQ and integer ops), as ONNX facts: which ops quantize, the units a
reduction must keep whole, the quantization step of each tensor, the tensors downstream of
quantized ops, the fp32 twin (the model without its activation Q/DQ pairs), and what each
QuantizeLinear clips on given activations (``clipping.py``, whose names are importable from here).

A **unit** is a QuantizeLinear with the DequantizeLinear nodes that read its integer output, or a
DynamicQuantizeLinear with the integer ops that read its integer output: cutting between them
would feed an engine an integer tensor where the model quantizes (a DequantizeLinear with no
Quantize in front, which TensorRT's explicit quantization reads as another program). Scales and
zero points are initializers or constants, which extraction always keeps (it never feeds them).

Must not run engines or judge verdicts.
"""

from __future__ import annotations

import numpy as np

from reprokit.graph.clipping import Clipping, clip_bounds, clipping, fused_activation  # noqa: F401
from reprokit.graph.qtypes import (
    DQ,
    Lookup,
    Q,
    constant_value,
    element_type,
    q_range,
)

DYNQ = "DynamicQuantizeLinear"
# ops that compute on integers (QOperator format, dynamic quantization) and their scale slots
INTEGER_OPS = {
    "QLinearConv": (1, 4, 6),
    "QLinearMatMul": (1, 4, 6),
    "QLinearAdd": (1, 4, 6),
    "QLinearMul": (1, 4, 6),
    "QLinearSigmoid": (1, 3),
    "QLinearLeakyRelu": (1, 3),
    "QLinearAveragePool": (1, 3),
    "QLinearGlobalAveragePool": (1, 3),
    "QLinearConcat": (),
    "QGemm": (1, 4, 7),
    "MatMulInteger": (),
    "ConvInteger": (),
    "DynamicQuantizeMatMul": (),
    "MatMulIntegerToFloat": (),
    "DynamicQuantizeLSTM": (),
}
QUANT_OPS = {Q, DQ, DYNQ, *INTEGER_OPS}
# ops through which a dequantized value keeps its grid (the step still bounds one rounding)
_GRID_KEEPING = {
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Relu",
    "MaxPool",
    "Slice",
    "Gather",
    "Concat",
    "Split",
}


def holds_quantized(model) -> dict[str, int]:
    """The quantization ops of ``model``'s top-level graph, with counts (empty: none)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANT_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def integer_activations(model) -> frozenset[str]:
    """The integer tensors quantizing ops compute (a QuantizeLinear's, a QLinear op's output):
    activations, never shapes or indices — a cut there is fed as data, never frozen in."""
    return frozenset(
        node.output[0]
        for node in model.graph.node
        if node.output
        and (
            node.op_type in (Q, DYNQ)
            or node.op_type.startswith("QLinear")
            or node.op_type == "QGemm"
        )
    )


def units(model, index) -> dict[int, frozenset[int]]:
    """node index → the unit it belongs to (nodes in no unit are absent). Each Q (DynamicQuantize)
    node with every DequantizeLinear (integer op) that reads its integer output; units that share
    a node are merged."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(model.graph.node):
        if node.op_type not in (Q, DYNQ) or not node.output:
            continue
        find(i)
        for reader in index.consumers.get(node.output[0], ()):
            parent[find(reader)] = find(i)
    groups: dict[int, set[int]] = {}
    for i in list(parent):
        groups.setdefault(find(i), set()).add(i)
    return {i: frozenset(group) for group in groups.values() if len(group) > 1 for i in group}


def regions(model, index, unit_of: dict[int, frozenset[int]]) -> dict[int, frozenset[int]]:
    """node index → the smallest candidate that holds it as the quantized model runs it: a float
    op with the Q/DQ units (and weight DequantizeLinear nodes) that feed it and the units that
    quantize its outputs — what TensorRT or OpenVINO fuse into one int8 kernel; a Q or DQ node
    → its unit. Nodes of a model without Q/DQ are absent (alone, as ever)."""
    if not unit_of:
        return {}
    graph = model.graph
    found: dict[int, frozenset[int]] = {}
    for i, node in enumerate(graph.node):
        if node.op_type in (Q, DQ, DYNQ):
            found[i] = unit_of.get(i, frozenset([i]))
            continue
        nodes = {i}
        for tensor in index.node_inputs[i]:
            p = index.producer.get(tensor)
            if p is not None and graph.node[p].op_type == DQ:
                nodes |= unit_of.get(p, {p})
        for tensor in index.node_outputs[i]:
            for reader in index.consumers.get(tensor, ()):
                if graph.node[reader].op_type in (Q, DYNQ):
                    nodes |= unit_of.get(reader, {reader})
        if len(nodes) > 1:
            found[i] = frozenset(nodes)
    return found


def splits_unit(nodes, unit_of: dict[int, frozenset[int]]) -> frozenset[int] | None:
    """The first unit ``nodes`` holds only part of, or None when it holds every unit whole."""
    nodes = frozenset(nodes)
    for i in nodes:
        unit = unit_of.get(i)
        if unit is not None and not unit <= nodes:
            return unit
    return None


def tensor_grids(model, index) -> dict[str, tuple[float, str]]:
    """tensor → (scale, element type) of the grid it lies on (the largest scale, for per-channel
    scales): the output of a DequantizeLinear, the input of a QuantizeLinear (it is rounded to that
    grid next), and what grid-keeping ops (reshape, transpose, relu, max-pool …) make of a
    dequantized tensor."""
    grids: dict[str, tuple[float, str]] = {}
    for node in model.graph.node:
        if node.op_type in (Q, DQ) and len(node.input) > 1:
            scale = constant_value(model, index, node.input[1])
            if scale is None or scale.size == 0:
                continue
            step = float(np.max(np.abs(scale)))
            tensor = node.output[0] if node.op_type == DQ else node.input[0]
            if step >= grids.get(tensor, (0.0, ""))[0]:
                grids[tensor] = (step, element_type(model, index, node))
    for node in model.graph.node:  # topological: a chain of grid-keeping ops inherits the grid
        if node.op_type in _GRID_KEEPING and node.input and node.input[0] in grids:
            for out in node.output:
                if out and out not in grids:
                    grids[out] = grids[node.input[0]]
    return grids


def tensor_steps(model, index) -> dict[str, float]:
    """tensor → its quantization step (the scale of :func:`tensor_grids`; for an FP8 grid the
    scale of its unit spacing, see :func:`float8_spacing`)."""
    return {tensor: step for tensor, (step, _) in tensor_grids(model, index).items()}


def downstream(model, index) -> frozenset[str]:
    """Tensors computed from a quantized value (an integer op's or a DequantizeLinear's output,
    or anything after them): where an fp32 tolerance judges expected int8 rounding."""
    seeds = [
        i
        for i, node in enumerate(model.graph.node)
        if node.op_type in QUANT_OPS and node.op_type != Q
    ]
    reached: set[int] = set()
    for seed in seeds:
        if seed not in reached:
            reached |= index.descendants(seed)
    return frozenset(t for i in reached for t in index.node_outputs[i])


def fp32_twin(model, only: set[str] | None = None):
    """A copy of ``model`` without its activation Q/DQ pairs (each DequantizeLinear(Quantize(x))
    read as x; a pair that took the place of a Relu/Clip becomes that clamp again) and with its
    quantized weights dequantized into float initializers: the model the quantization was made
    from, up to the weights' own rounding. ``only``: drop just the pairs of these QuantizeLinear
    nodes (the weights stay quantized). Integer ops (QLinear*, MatMulInteger, DynamicQuantize*)
    have no such twin: ValueError names the first."""
    import onnx
    from onnx import helper, numpy_helper

    twin = onnx.ModelProto.FromString(model.SerializeToString())
    graph = twin.graph
    index = Lookup.of(twin)
    if only is None:
        for node in graph.node:
            if node.op_type in INTEGER_OPS or node.op_type == DYNQ:
                raise ValueError(f"{node.op_type} {node.name!r} computes on integers: no fp32 twin")
    alias: dict[str, str] = {}
    dropped: set[int] = set()
    replaced: dict[int, object] = {}
    new_inits = []
    for i, node in enumerate(graph.node):
        if node.op_type != DQ:
            continue
        source = index.producer.get(node.input[0])
        if source is not None and graph.node[source].op_type == Q:
            q = graph.node[source]
            if only is not None and q.name not in only:
                continue
            fused = fused_activation(twin, q)
            if fused == "Relu":
                replaced[i] = helper.make_node(
                    "Relu", [q.input[0]], [node.output[0]], name=f"{q.name}__rk_relu"
                )
            elif fused == "Clip":
                bounds = clip_bounds(twin, q)
                if bounds is None:  # the removed Clip's bounds are gone: the pair's own range
                    lo, hi = q_range(twin, index, q)
                    bounds = (float(np.min(lo)), float(np.max(hi)))
                names = [f"{q.name}__rk_lo", f"{q.name}__rk_hi"]
                new_inits += [
                    numpy_helper.from_array(np.array(b, np.float32), n)
                    for b, n in zip(bounds, names)
                ]
                replaced[i] = helper.make_node(
                    "Clip", [q.input[0], *names], [node.output[0]], name=f"{q.name}__rk_clip"
                )
            else:
                alias[node.output[0]] = q.input[0]
                dropped.add(i)
            continue
        if only is not None:
            continue
        value = constant_value(twin, index, node.input[0])
        if value is None:
            continue
        scale = constant_value(twin, index, node.input[1])
        zero = (
            constant_value(twin, index, node.input[2])
            if len(node.input) > 2 and node.input[2]
            else None
        )
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        new_inits.append(
            numpy_helper.from_array(_dequantize(value, scale, zero, axis), node.output[0])
        )
        dropped.add(i)
    nodes = [replaced.get(i, node) for i, node in enumerate(graph.node)]
    for node in nodes:
        node.input[:] = [_resolve(alias, name) for name in node.input]
    keep = [n for i, n in enumerate(nodes) if i not in dropped]
    for out in graph.output:
        if out.name in alias:  # an output made by a dropped DQ: an Identity keeps its name
            keep.append(helper.make_node("Identity", [_resolve(alias, out.name)], [out.name]))
    still_read = {name for n in keep for name in n.input} | {o.name for o in graph.output}
    keep = [n for n in keep if n.op_type != Q or any(o in still_read for o in n.output)]
    del graph.node[:]
    graph.node.extend(keep)
    graph.initializer.extend(new_inits)
    read = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
    kept_inits = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    del graph.value_info[:]
    return twin


def _resolve(alias: dict[str, str], name: str) -> str:
    while name in alias:
        name = alias[name]
    return name


def _dequantize(value, scale, zero, axis: int) -> np.ndarray:
    value = np.asarray(value).astype(np.float32)
    scale = np.asarray(scale, np.float32)
    zero = np.zeros_like(scale) if zero is None else np.asarray(zero).astype(np.float32)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * value.ndim
        shape[axis % value.ndim] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((value - zero) * scale).astype(np.float32)
