"""Extract a standalone, valid model from a subset of a model's nodes.

Tensors a kept node consumes but no kept node produces become graph inputs (fed with captured
reference activations) or, for small non-float tensors such as shapes and indices, initializers;
tensors kept nodes produce that no kept node consumes become graph outputs. Nodes with
subgraphs (If/Loop/Scan) count their bodies' outer-scope references as inputs.
Must not know about divergence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.graph.index import GraphIndex, bodies

_CONST_LIMIT = 4096  # non-float cut tensors up to this many elements become initializers


def if_conditions(nodes) -> set[str]:
    """The condition tensors of the If nodes among ``nodes`` and inside their bodies."""
    names: set[str] = set()
    for node in nodes:
        if node.op_type == "If" and node.input:
            names.add(node.input[0])
        for body in bodies(node):
            names |= if_conditions(body.node)
    return names


class NotCaptured(KeyError):
    """A cut tensor the reference capture holds no value of (a sequence or optional inside an
    opened If, say): a candidate that needs it cannot be built."""


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
    from onnx import helper, numpy_helper

    keep = sorted(keep)
    kept = set(keep)
    produced = {t for i in keep for t in index.node_outputs[i]}
    consumed: dict[str, None] = {}
    for i in keep:
        for tensor in index.node_inputs[i]:
            consumed.setdefault(tensor, None)
    # built in place in its model: helper.make_model copies a graph it is given, weights and all
    # (20 s of a 3,647-node Swin shrink's 47 s of extraction)
    sub = _empty_like(model)
    graph = sub.graph
    graph.name = "reprokit_subgraph"
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
        if not user_input and tensor not in store:
            raise NotCaptured(tensor)
        value = np.asarray(feeds[tensor]) if user_input else store.get(tensor)
        # The user's own inputs (token ids, masks) stay inputs: baked in as constants, engines
        # would fold them and every candidate would test another program. Small non-float CUT
        # tensors (shapes, indices) become constants: fed as inputs they would turn static
        # shapes dynamic, which is itself a different program for TensorRT.
        # Cut tensors that depend on no graph input are constants of the user's model: folded
        # here, per candidate, so the model itself is confirmed exactly as given. An If's
        # condition computed at run time stays an input: folded, the engine would resolve an If
        # it could not resolve in the model (and drop the branch it fails on).
        small = (value.dtype.kind not in "fc" and value.size <= _CONST_LIMIT and tensor not in conditions
                 and tensor not in index.quantized)  # an int8 activation is data, not a shape
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
    del kept
    return Extraction(finalize(sub) if check else sub, new_feeds, outputs)


def _empty_like(model):
    """A model with ``model``'s IR version, opsets and local functions and an empty graph."""
    import onnx

    made = onnx.ModelProto(ir_version=model.ir_version, producer_name="reprokit")
    made.opset_import.extend(model.opset_import)
    made.functions.extend(model.functions)
    return made


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
