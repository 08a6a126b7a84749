"""Rewrite decomposed LayerNorms as one LayerNormalization node (opset 17).

Exporters before opset 17 (and NAFNet's LayerNorm2d at any opset) write a LayerNorm as
ReduceMean → Sub → Pow(2) → ReduceMean → Add(eps) → Sqrt → Div [→ Mul(gamma) → Add(beta)].
In fp16 the squared deviations and the variance are stored and can overflow; one
LayerNormalization node computes them inside the kernel in fp32 (TensorRT's advice: export with
opset ≥ 17). Axes that are not the trailing ones (channel LayerNorm on NCHW) get a Transpose
before and after. Pure graph rewrite: no engine, numpy/onnx only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.graph.index import consumers_of
from reprokit.standalone.names import FreshNames

LAYERNORM_OPSET = 17


@dataclass(frozen=True)
class LayerNormMatch:
    nodes: tuple[str, ...]  # names of the replaced nodes
    fused: str  # name of the LayerNormalization node
    axes: tuple[int, ...]
    transposed: bool
    affine: bool

    def to_json(self) -> dict:
        return {"nodes": list(self.nodes), "fused": self.fused, "axes": list(self.axes),
                "transposed": self.transposed, "affine": self.affine}


class _Graph:
    """Producer/consumer links and constant values of a graph, for pattern matching."""

    def __init__(self, model, base_dir: str = ""):
        graph = model.graph
        self.base_dir = base_dir
        self.nodes = list(graph.node)
        self.consumers = consumers_of(graph)  # If/Loop bodies' reads count: such a tensor is shared
        # Tensor protos by name, read only when a pattern asks (weights may be external data).
        self.constants = {t.name: t for t in graph.initializer}
        for node in self.nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t
        self.outputs = {o.name for o in graph.output}
        self.shapes, self.types = _shapes(model)

    def only_consumer(self, tensor: str, op: str):
        users = self.consumers.get(tensor, [])
        if len(users) != 1 or tensor in self.outputs or self.nodes[users[0]].op_type != op:
            return None
        return users[0]

    def const(self, tensor: str):
        from onnx import numpy_helper

        proto = self.constants.get(tensor)
        return None if proto is None else numpy_helper.to_array(proto, self.base_dir)


def _shapes(model) -> tuple[dict[str, list], dict[str, int]]:
    """Dims and ONNX element types of every tensor shape inference knows."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # no shapes: patterns needing a rank are skipped
        return {}, {}
    out, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return out, types


def _attr(node, name, default=None):
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _axes(g: _Graph, node) -> list[int] | None:
    axes = _attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = g.const(node.input[1])
        axes = None if value is None else [int(a) for a in np.asarray(value).ravel()]
    if axes is None or _attr(node, "keepdims", 1) != 1:
        return None
    return list(axes)


def _match(g: _Graph, start: int):
    """The pattern starting at ReduceMean ``start``, as a dict of parts, or None."""
    mean = g.nodes[start]
    x = mean.input[0]
    axes = _axes(g, mean)
    rank = len(g.shapes.get(x) or [])
    if axes is None or not rank:
        return None
    axes = sorted(a % rank for a in axes)
    sub_i = g.only_consumer(mean.output[0], "Sub")
    if sub_i is None or list(g.nodes[sub_i].input) != [x, mean.output[0]]:
        return None
    d = g.nodes[sub_i].output[0]
    users = [g.nodes[i] for i in dict.fromkeys(g.consumers.get(d, []))]
    square = next((n for n in users if n.op_type == "Pow" and n.input[0] == d and n.input[1] in g.constants
                   and np.allclose(g.const(n.input[1]), 2.0)), None)
    square = square or next((n for n in users if n.op_type == "Mul" and list(n.input) == [d, d]), None)
    div = next((n for n in users if n.op_type == "Div" and n.input[0] == d), None)
    if square is None or div is None or len(users) != 2 or d in g.outputs:
        return None
    var_i = g.only_consumer(square.output[0], "ReduceMean")
    if var_i is None or _axes(g, g.nodes[var_i]) is None or sorted(a % rank for a in _axes(g, g.nodes[var_i])) != axes:
        return None
    add_i = g.only_consumer(g.nodes[var_i].output[0], "Add")
    if add_i is None:
        return None
    add = g.nodes[add_i]
    eps_name = next((n for n in add.input if n != g.nodes[var_i].output[0]), None)
    eps = g.const(eps_name) if eps_name else None
    if eps is None or np.asarray(eps).size != 1:
        return None
    sqrt_i = g.only_consumer(add.output[0], "Sqrt")
    if sqrt_i is None or g.only_consumer(g.nodes[sqrt_i].output[0], "Div") is None:
        return None
    if div.input[1] != g.nodes[sqrt_i].output[0]:
        return None
    parts = [mean, g.nodes[sub_i], square, g.nodes[var_i], add, g.nodes[sqrt_i], div]
    gamma = beta = None
    out = div.output[0]
    mul_i = g.only_consumer(out, "Mul")
    if mul_i is not None:
        other = next((n for n in g.nodes[mul_i].input if n != out), None)
        if other in g.constants:
            gamma, out = g.const(other), g.nodes[mul_i].output[0]
            parts.append(g.nodes[mul_i])
            add2_i = g.only_consumer(out, "Add")
            if add2_i is not None:
                other = next((n for n in g.nodes[add2_i].input if n != out), None)
                if other in g.constants:
                    beta, out = g.const(other), g.nodes[add2_i].output[0]
                    parts.append(g.nodes[add2_i])
    return {"x": x, "axes": axes, "rank": rank, "eps": float(np.asarray(eps).ravel()[0]), "parts": parts,
            "gamma": gamma, "beta": beta, "out": out}


def _per_axis(value, shape: list, rank: int, axes: list[int]):
    """``value`` (broadcastable onto x) as an array over the normalized axes, or None when it
    varies along other axes."""
    if value is None:
        return np.ones([shape[a] for a in axes], dtype=np.float32)
    array = np.asarray(value, dtype=np.float32)
    if array.ndim > rank:
        return None
    array = array.reshape((1,) * (rank - array.ndim) + array.shape)
    if any(array.shape[a] != 1 for a in range(rank) if a not in axes):
        return None
    kept = array.reshape([array.shape[a] for a in axes])
    return np.ascontiguousarray(np.broadcast_to(kept, [shape[a] for a in axes]))


def _prefix(names: list[str]) -> str:
    import os

    common = os.path.commonprefix(names).rstrip("/_.")
    return common or names[0]


def fuse_layernorms(model, base_dir: str = ""):
    """A copy of ``model`` with every decomposed LayerNorm replaced; and the matches.

    Models below opset 17 are first converted with onnx's version converter. Returns
    ``(model, [])`` unchanged when no pattern is found. ``base_dir``: where external weights are.
    """
    import onnx
    from onnx import helper, numpy_helper

    probe = _Graph(model, base_dir)
    if not any(_match(probe, i) for i, n in enumerate(probe.nodes) if n.op_type == "ReduceMean"):
        return model, []
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if opset < LAYERNORM_OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, LAYERNORM_OPSET)
    g = _Graph(model, base_dir)
    pool = FreshNames.of(model)  # two blocks whose names share a short prefix stay apart
    replaced: dict[int, list] = {}  # index of a pattern's last node -> new nodes
    dropped: set[int] = set()
    matches: list[LayerNormMatch] = []
    index_of = {id(n): i for i, n in enumerate(g.nodes)}
    for start, node in enumerate(g.nodes):
        if node.op_type != "ReduceMean" or start in dropped:
            continue
        found = _match(g, start)
        if not found:
            continue
        shape = g.shapes.get(found["x"]) or []
        axes, rank = found["axes"], found["rank"]
        if any(shape[a] is None for a in axes):
            continue
        scale = _per_axis(found["gamma"], shape, rank, axes)
        bias = _per_axis(found["beta"] if found["beta"] is not None else 0.0, shape, rank, axes)
        if scale is None or bias is None:
            continue
        names = [n.name for n in found["parts"]]
        fused = pool.fresh(f"{_prefix(names)}/LayerNormalization")
        trailing = axes == list(range(rank - len(axes), rank))
        new = []
        x, out = found["x"], found["out"]
        if not trailing:
            perm = [a for a in range(rank) if a not in axes] + axes
            x = pool.fresh(f"{fused}/in")
            new.append(helper.make_node("Transpose", [found["x"]], [x], name=pool.fresh(f"{fused}/transpose_in"),
                                        perm=perm))
        scale_name, bias_name = pool.fresh(f"{fused}.scale"), pool.fresh(f"{fused}.bias")
        # LayerNormalization takes scale and bias in X's type: float32 ones in an fp16 model
        # make a model onnxruntime refuses to load
        dtype = helper.tensor_dtype_to_np_dtype(g.types.get(found["x"], onnx.TensorProto.FLOAT))
        model.graph.initializer.extend([numpy_helper.from_array(scale.astype(dtype), scale_name),
                                        numpy_helper.from_array(bias.astype(dtype), bias_name)])
        ln_out = out if trailing else pool.fresh(f"{fused}/out")
        new.append(helper.make_node("LayerNormalization", [x, scale_name, bias_name], [ln_out], name=fused,
                                    axis=rank - len(axes), epsilon=found["eps"]))
        if not trailing:
            inverse = list(np.argsort(perm))
            new.append(helper.make_node("Transpose", [ln_out], [out], name=pool.fresh(f"{fused}/transpose_out"),
                                        perm=[int(p) for p in inverse]))
        indices = [index_of[id(n)] for n in found["parts"]]
        dropped.update(indices)
        replaced[max(indices)] = new
        matches.append(LayerNormMatch(tuple(names), fused, tuple(axes), not trailing, found["gamma"] is not None))
    if not matches:
        return model, []
    nodes = []
    for index, node in enumerate(g.nodes):
        if index in replaced:
            nodes.extend(replaced[index])
        elif index not in dropped:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    _drop_unused(model)
    onnx.checker.check_model(model)
    return model, matches


def _drop_unused(model) -> None:
    """Remove initializers, Constant nodes and value_info the removed nodes alone used."""
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    keep = [n for n in model.graph.node if n.op_type != "Constant" or any(o in used for o in n.output)]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    produced = {o for n in model.graph.node for o in n.output}
    inits = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    infos = [v for v in model.graph.value_info if v.name in produced]
    del model.graph.value_info[:]
    model.graph.value_info.extend(infos)
