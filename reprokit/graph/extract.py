"""Extract a standalone, valid model from a subset of a model's nodes.

Tensors a kept node consumes but no kept node produces become graph inputs (fed with captured
reference activations) or, for small non-float tensors such as shapes and indices, initializers;
tensors kept nodes produce that no kept node consumes become graph outputs. Nodes with
subgraphs (If/Loop/Scan) count their bodies' outer-scope references as inputs.
Must not know about divergence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reprokit.graph.model import inferred_value_info

_CONST_LIMIT = 4096  # non-float cut tensors up to this many elements become initializers
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


@dataclass(frozen=True)
class GraphIndex:
    """Producer/consumer facts of a model, computed once and shared by every extraction."""

    node_inputs: tuple[tuple[str, ...], ...]  # per node: data inputs + implicit outer-scope refs
    node_outputs: tuple[tuple[str, ...], ...]
    producer: dict  # tensor -> node index
    initializers: dict  # name -> TensorProto
    graph_inputs: frozenset
    graph_outputs: tuple[str, ...]
    value_info: dict  # name -> ValueInfoProto (from shape inference)
    constants: frozenset = frozenset()  # tensors that depend on no graph input (foldable)
    declared: dict = field(default_factory=dict)  # graph input -> its ValueInfoProto as the model declares it

    @classmethod
    def build(cls, model) -> GraphIndex:
        value_info = inferred_value_info(model)
        node_inputs, node_outputs, producer = [], [], {}
        for index, node in enumerate(model.graph.node):
            inputs = [i for i in node.input if i]
            for extra in sorted(outer_scope_names(node)):
                if extra not in inputs:
                    inputs.append(extra)
            node_inputs.append(tuple(inputs))
            node_outputs.append(tuple(o for o in node.output if o))
            for out in node.output:
                if out:
                    producer[out] = index
        initializers = {t.name: t for t in model.graph.initializer}
        inputs = frozenset(i.name for i in model.graph.input if i.name not in initializers)
        constants: set[str] = set()
        for index, node in enumerate(model.graph.node):
            if node.op_type in _RANDOM or any(True for a in node.attribute if a.graphs or a.HasField("g")):
                continue
            if all(t in initializers or t in constants for t in node_inputs[index]):
                constants.update(node_outputs[index])
        declared = {i.name: i for i in model.graph.input if i.name in inputs}
        return cls(tuple(node_inputs), tuple(node_outputs), producer, initializers, inputs,
                   tuple(o.name for o in model.graph.output), value_info, frozenset(constants), declared)

    def ancestors(self, index: int, within: set[int] | None = None) -> set[int]:
        """Nodes ``index`` depends on (itself included), optionally only inside ``within``."""
        seen, stack = {index}, [index]
        while stack:
            for tensor in self.node_inputs[stack.pop()]:
                parent = self.producer.get(tensor)
                if parent is not None and parent not in seen and (within is None or parent in within):
                    seen.add(parent)
                    stack.append(parent)
        return seen


    def descendants(self, index: int, within: set[int] | None = None) -> set[int]:
        """Nodes that depend on ``index`` (itself included), optionally only inside ``within``."""
        consumers: dict[str, list[int]] = {}
        for node, inputs in enumerate(self.node_inputs):
            for tensor in inputs:
                consumers.setdefault(tensor, []).append(node)
        seen, stack = {index}, [index]
        while stack:
            for tensor in self.node_outputs[stack.pop()]:
                for child in consumers.get(tensor, ()):
                    if child not in seen and (within is None or child in within):
                        seen.add(child)
                        stack.append(child)
        return seen


def bodies(node):
    """The subgraph bodies of ``node`` (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        yield from attr.graphs
        if attr.HasField("g"):
            yield attr.g


def rename_outer_refs(body, mapping: dict[str, str], shadow: set[str]) -> None:
    """Inside a subgraph body, rename references to outer names; names the body (or a body
    around it) defines itself shadow the outer ones and stay."""
    local = set(shadow) | {i.name for i in body.input} | {t.name for t in body.initializer}
    for node in body.node:
        local.update(o for o in node.output if o)
    for node in body.node:
        node.input[:] = [i if (not i or i in local) else mapping.get(i, i) for i in node.input]
        for inner in bodies(node):
            rename_outer_refs(inner, mapping, local)
    for out in body.output:
        if out.name not in local and out.name in mapping:
            out.name = mapping[out.name]


def if_conditions(nodes) -> set[str]:
    """The condition tensors of the If nodes among ``nodes`` and inside their bodies."""
    names: set[str] = set()
    for node in nodes:
        if node.op_type == "If" and node.input:
            names.add(node.input[0])
        for body in bodies(node):
            names |= if_conditions(body.node)
    return names


def outer_scope_names(node) -> set[str]:
    """Names a node's subgraph bodies read from the enclosing graph."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for graph in graphs:
            local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                local.update(o for o in inner.output if o)
            for inner in graph.node:
                names.update(i for i in inner.input if i and i not in local)
                names.update(n for n in outer_scope_names(inner) if n not in local)
    return names


@dataclass
class Extraction:
    model: object  # onnx.ModelProto
    feeds: dict[str, np.ndarray]  # graph input -> captured activation
    outputs: list[str]


def extract(model, index: GraphIndex, keep, store, *, feeds: dict | None = None,
            check: bool = True) -> Extraction:
    """Standalone model of the nodes in ``keep`` (indices into model.graph.node).

    ``store`` supplies activations for cut tensors; ``feeds`` the original graph inputs.
    ``check=False`` skips shape inference and the checker (members of a pack, checked once as
    a whole).
    """
    import onnx
    from onnx import helper, numpy_helper

    keep = sorted(keep)
    kept = set(keep)
    produced = {t for i in keep for t in index.node_outputs[i]}
    consumed: dict[str, None] = {}
    for i in keep:
        for tensor in index.node_inputs[i]:
            consumed.setdefault(tensor, None)
    graph = onnx.GraphProto(name="reprokit_subgraph")
    graph.node.extend(model.graph.node[i] for i in keep)
    conditions = if_conditions(graph.node)
    new_feeds: dict[str, np.ndarray] = {}
    for tensor in consumed:
        if tensor in produced:
            continue
        if tensor in index.initializers:
            graph.initializer.append(index.initializers[tensor])
            continue
        user_input = tensor in index.graph_inputs and feeds is not None and tensor in feeds
        value = np.asarray(feeds[tensor]) if user_input else store.get(tensor)
        # The user's own inputs (token ids, masks) stay inputs: baked in as constants, engines
        # would fold them and every candidate would test another program. Small non-float CUT
        # tensors (shapes, indices) become constants: fed as inputs they would turn static
        # shapes dynamic, which is itself a different program for TensorRT.
        # Cut tensors that depend on no graph input are constants of the user's model: folded
        # here, per candidate, so the model itself is confirmed exactly as given. An If's
        # condition computed at run time stays an input: folded, the engine would resolve an If
        # it could not resolve in the model (and drop the branch it fails on).
        small = value.dtype.kind not in "fc" and value.size <= _CONST_LIMIT and tensor not in conditions
        if not user_input and (tensor in index.constants or small):
            graph.initializer.append(numpy_helper.from_array(np.array(value), tensor))
            continue
        if user_input and tensor in index.declared:
            # the user's own input keeps its declared type: dynamic dims stay dynamic (an engine
            # may fail only on them), the feeds give the sizes as they did for the original
            graph.input.append(index.declared[tensor])
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph.input.append(helper.make_tensor_value_info(tensor, elem, _known_dims(index, tensor, value.shape)))
        new_feeds[tensor] = value
    consumed_by_kept = set(consumed)
    outputs = []
    for i in keep:
        for tensor in index.node_outputs[i]:
            if tensor not in consumed_by_kept or tensor in index.graph_outputs:
                outputs.append(tensor)
    for tensor in outputs:
        if tensor in store:
            shape, dtype = store.info(tensor)
            graph.output.append(helper.make_tensor_value_info(
                tensor, helper.np_dtype_to_tensor_dtype(dtype), list(shape)))
        elif tensor in index.value_info:
            graph.output.append(index.value_info[tensor])
        else:
            graph.output.append(helper.make_empty_tensor_value_info(tensor))
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                            producer_name="reprokit")
    sub.functions.extend(model.functions)
    del kept
    return Extraction(finalize(sub) if check else sub, new_feeds, outputs)


def _known_dims(index: GraphIndex, tensor: str, shape: tuple) -> list:
    """A cut tensor's dims as the engine knew them in the whole model: a dim that shape inference
    could not pin there (it follows a dynamic input, a data-dependent shape) stays dynamic, so the
    engine sees no more than it saw (an If it could not resolve stays unresolved); the feeds give
    the sizes. Where the whole model's inference says nothing, the feed's shape."""
    info = index.value_info.get(tensor)
    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return list(shape)
    dims = info.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        return list(shape)
    return [size if dim.HasField("dim_value") and dim.dim_value > 0 else (dim.dim_param or f"{tensor}_dim{axis}")
            for axis, (dim, size) in enumerate(zip(dims, shape))]


def finalize(model):
    """Shape inference and the checker; the unchecked model is kept if either fails (the
    engines, not onnx's checker, decide what is interesting)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        onnx.checker.check_model(inferred)
        return inferred
    except Exception:
        return model
