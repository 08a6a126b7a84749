"""Quantized models (Q/DQ and integer ops), as ONNX facts: which ops quantize, the units a
reduction must keep whole, the quantization step of each tensor, the tensors downstream of
quantized ops, the fp32 twin (the model without its activation Q/DQ pairs), and what each
QuantizeLinear clips on given activations.

A **unit** is a QuantizeLinear with the DequantizeLinear nodes that read its integer output, or a
DynamicQuantizeLinear with the integer ops that read its integer output: cutting between them
would feed an engine an integer tensor where the model quantizes (a DequantizeLinear with no
Quantize in front, which TensorRT's explicit quantization reads as another program). Scales and
zero points are initializers or constants, which extraction always keeps (it never feeds them).

Must not run engines or judge verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.graph.qtypes import (
    DQ,
    FLOAT8,
    Lookup,
    Q,
    constant_value,
    element_type,
    float8_spacing,
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


def fused_activation(model, node) -> str | None:
    """ "Relu" or "Clip" when the QuantizeLinear ``node`` took the place of that activation:
    onnxruntime's quantizer removes a Relu/Clip whose range the Q/DQ pair's saturation holds and
    gives the activation's output name to what fed it (a Conv writes ``…/Clip_output_0``), or
    names the Q after the removed output. Its clipping below the range (Relu) or on both sides
    (Clip) is the model's, not calibration's."""
    if node.op_type != Q:
        return None
    producer = next((n.op_type for n in model.graph.node if node.input[0] in n.output), None)
    if producer in ("Relu", "Clip"):
        return None
    names = [node.input[0]]
    if node.name.endswith("_QuantizeLinear"):
        names.append(node.name[: -len("_QuantizeLinear")])
    for name in names:
        last = name.rsplit("/", 1)[-1].lower()
        if "clip" in last:
            return "Clip"
        if "relu" in last:
            return "Relu"
    return None


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
                bounds = _clip_bounds(twin, q)
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


def _clip_bounds(model, q) -> tuple[float, float] | None:
    """The bounds of the Clip onnxruntime's quantizer removed in front of ``q``: it leaves the
    Clip's min/max behind, unread, as scalar initializers or Constant nodes in the Clip's scope
    (``…/activation/``); None when there are not exactly two."""
    from onnx import numpy_helper

    scope = q.input[0].rsplit("/", 1)[0] + "/"
    read = {name for n in model.graph.node for name in n.input}
    tensors = [
        t for t in model.graph.initializer if t.name.startswith(scope) and t.name not in read
    ]
    for node in model.graph.node:
        if (
            node.op_type == "Constant"
            and node.output[0].startswith(scope)
            and node.output[0] not in read
        ):
            tensors += [a.t for a in node.attribute if a.name == "value"]
    found = [float(numpy_helper.to_array(t)) for t in tensors if not t.dims and t.data_type == 1]
    return (min(found), max(found)) if len(found) == 2 else None


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


@dataclass(frozen=True)
class Clipping:
    """What one QuantizeLinear clips on one run: the share of its input outside the range its
    scale and zero point can represent, and how far past it the input reaches."""

    node: str  # the QuantizeLinear's name
    tensor: str  # its input
    clipped: float  # share of elements outside [lo, hi]
    lo: float
    hi: float
    seen_min: float
    seen_max: float
    reader_ops: tuple[str, ...]  # names of the float nodes that read the dequantized value
    # the float node that computes the clipped tensor ("" for a graph input): onnxruntime's
    # quantizer also quantizes a quantized op's output, so excluding the readers alone leaves the pair
    producer: str = ""

    @property
    def widen_by(self) -> float:
        """How many times wider the calibrated range must be to hold every value seen."""
        over = self.seen_max / self.hi if self.hi > 0 and self.seen_max > self.hi else 1.0
        under = self.seen_min / self.lo if self.lo < 0 and self.seen_min < self.lo else 1.0
        return max(over, under, 1.0) if (self.hi > 0 or self.lo < 0) else float("inf")


def clipping(model, index, values) -> list[Clipping]:
    """Every QuantizeLinear whose input (``values``: tensor → array, e.g. the reference
    capture) holds values outside its representable range, most clipped first. A pair that took
    the place of a Relu counts only the values above its range; one that took a Clip's, none."""
    found = []
    for node in model.graph.node:
        if node.op_type != Q or node.input[0] not in values or len(node.input) < 2:
            continue
        if constant_value(model, index, node.input[1]) is None:
            continue
        fused = fused_activation(model, node)
        x = np.asarray(values[node.input[0]], np.float32)
        # a pair in a removed activation's place: what the activation itself clamps is the model's
        if fused == "Clip":
            bounds = _clip_bounds(model, node)
            if bounds is None:
                continue  # the Clip's own bounds are gone: its clipping cannot be told from calibration's
            x = np.clip(x, *bounds)
        elif fused == "Relu":
            x = np.maximum(x, 0)
        lo, hi = q_range(model, index, node, x.ndim)
        kind = element_type(model, index, node)
        # half a step at the range's edge: rounding, not clipping (FP8's grid is widest there)
        half = (
            hi / FLOAT8[kind][0] * float8_spacing(kind, FLOAT8[kind][0]) / 2
            if kind in FLOAT8
            else (hi - lo) / 255 / 2
        )
        outside = (x > hi + half) | (x < lo - half)
        share = float(np.mean(outside)) if x.size else 0.0
        if share > 0:
            readers = tuple(
                model.graph.node[r].name
                for dq in index.consumers.get(node.output[0], ())
                for out in index.node_outputs[dq]
                for r in index.consumers.get(out, ())
            )
            source = index.producer.get(node.input[0])
            made_by = model.graph.node[source] if source is not None else None
            producer = (
                made_by.name
                if made_by is not None and made_by.op_type not in (Q, DQ, "Constant")
                else ""
            )
            seen_min = float(np.min(x))
            found.append(
                Clipping(
                    node.name,
                    node.input[0],
                    share,
                    float(np.min(lo)),
                    float(np.max(hi)),
                    seen_min,
                    float(np.max(x)),
                    readers,
                    producer,
                )
            )
    return sorted(found, key=lambda c: -c.clipped)
