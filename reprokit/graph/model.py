"""A model's inputs and names: input infos, freezing input shapes, node labels (``OP_INDEX`` for
unnamed nodes) and the names ``fp32-nodes=`` can use, float tensors, marking intermediate tensors
as outputs. Files are :mod:`reprokit.graph.io`'s; constant folding, which runs onnxruntime, is
:mod:`reprokit.engine.folding`'s. Must not run a backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reprokit.errors import InputError, UsageError
from reprokit.graph.index import inferred_value_info, iter_nodes
from reprokit.graph.io import load_model
from reprokit.spec import parse_target


@dataclass(frozen=True)
class InputInfo:
    name: str
    dtype: np.dtype  # the element dtype (of each tensor, for a sequence or an optional)
    shape: tuple[int | str | None, ...]  # int for static dims, str/None for dynamic ones
    kind: str = "tensor"  # tensor, sequence, optional, optional-sequence (ONNX's value types); or map

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)


def input_infos(model) -> list[InputInfo]:
    """Real graph inputs (initializers listed as inputs excluded), with numpy dtypes."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    infos = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        kind, tensor = _value_kind(vi.type)
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else np.dtype("float32")
        except (KeyError, TypeError, ValueError):
            dtype = np.dtype("float32") if tensor.elem_type != 8 else np.dtype(object)
        dims = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or None)
        infos.append(InputInfo(vi.name, dtype, tuple(dims), kind))
    return infos


def _value_kind(type_proto):
    """(kind, TypeProto.Tensor of the elements) of a graph input's type: ``tensor``, ``sequence``
    (of tensors), ``optional`` (of a tensor), ``optional-sequence``; anything else is ``map``
    (and other types no feed format here carries)."""
    import onnx

    which = type_proto.WhichOneof("value")
    if which == "tensor_type" or which is None:
        return "tensor", type_proto.tensor_type
    if which == "sequence_type" and type_proto.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
        return "sequence", type_proto.sequence_type.elem_type.tensor_type
    if which == "optional_type":
        inner = type_proto.optional_type.elem_type
        if inner.WhichOneof("value") == "tensor_type":
            return "optional", inner.tensor_type
        if inner.WhichOneof("value") == "sequence_type" and inner.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
            return "optional-sequence", inner.sequence_type.elem_type.tensor_type
    return "map", onnx.TypeProto.Tensor()


def output_names(model) -> list[str]:
    return [o.name for o in model.graph.output]


def freeze_input_shapes(model, shapes: dict[str, tuple[int, ...]]):
    """Set the given input shapes (validated against the model) and infer shapes. Folding the
    constants this makes static runs onnxruntime: the caller folds, checked against the
    reference (:func:`reprokit.engine.folding.checked_fold`)."""
    infos = {i.name: i for i in input_infos(model)}
    for name, shape in shapes.items():
        if name not in infos:
            raise InputError(
                f"--input-shapes names {name!r}, which is not an input of the model",
                hint=f"model inputs: {', '.join(infos) or '(none)'}",
            )
        declared = infos[name].shape
        if declared and len(declared) != len(shape):
            raise InputError(
                f"shape {list(shape)} for {name!r} has rank {len(shape)}, the model declares "
                f"rank {len(declared)} ({_fmt(declared)})",
                hint=f"give {len(declared)} dimensions, e.g. {name}:{'x'.join('1' if not isinstance(d, int) else str(d) for d in declared)}",
            )
        for axis, (want, have) in enumerate(zip(shape, declared)):
            if isinstance(have, int) and have > 0 and have != want:
                raise InputError(
                    f"shape {list(shape)} for {name!r} contradicts the model's static dim {axis} = {have} ({_fmt(declared)})",
                    hint="only dynamic dimensions can be changed",
                )
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for dim, value in zip(dims, shapes[vi.name]):
                dim.Clear()
                dim.dim_value = int(value)
    try:
        import onnx

        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: engines infer shapes themselves
        return model


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def node_label(node, index: int) -> str:
    """The name reprokit shows and ``fp32-nodes=`` accepts for a node: its own name, or for an
    unnamed node ``OP_INDEX`` — its op type and its 0-based position among the top-level nodes
    of the file (``Pow_4``: the fifth node, an unnamed Pow)."""
    return node.name or f"{node.op_type}_{index}"


def name_unnamed_nodes(model) -> int:
    """Give every unnamed top-level node its :func:`node_label`, in place; returns how many."""
    named = 0
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = node_label(node, index)
            named += 1
    return named


def node_labels(model) -> set[str]:
    """Every name ``fp32-nodes=`` can use on this model: node names (subgraph bodies too) and
    the ``OP_INDEX`` labels of unnamed top-level nodes."""
    labels = {node_label(n, i) for i, n in enumerate(model.graph.node)}
    labels.update(node.name for node in iter_nodes(model.graph) if node.name)
    return labels


def check_node_names(model, names, option: str = "fp32-nodes") -> None:
    """A UsageError (exit 2) when ``names`` holds a name that is no node of ``model``, with the
    closest names the model has."""
    import difflib

    labels = node_labels(model)
    unknown = [n for n in names if n not in labels]
    if not unknown:
        return
    close = []
    for name in unknown:
        close += [c for c in difflib.get_close_matches(name, labels, n=3, cutoff=0.5) if c not in close]
    shown = ", ".join(repr(n) for n in unknown[:5])
    raise UsageError(
        f"{option} names no node of the model: {shown}",
        hint=(f"did you mean {', '.join(close[:5])}? " if close else "")
        + "use the node names of the model file; an unnamed node is OP_INDEX (its op type and 0-based "
          "position in the file, e.g. Pow_4), as the layerwise table and audit show them")


def check_target_nodes(model, target: str) -> None:
    """Usage error before any work when the target's ``fp32-nodes=`` names no node of ``model``
    (a ModelProto or the path of the user's file, where ``OP_INDEX`` labels are counted; the
    file is read, without weights, only when the target has ``fp32-nodes``)."""
    spec = parse_target(target)
    if not spec.has("fp32-nodes"):
        return
    names = [n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip()]
    if isinstance(model, (str, os.PathLike)):
        model = load_model(os.fspath(model), load_weights=False)
    check_node_names(model, names)


def float_tensor_names(model) -> set[str]:
    """Names of node outputs whose inferred type is a float type."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    return {name for name, vi in inferred_value_info(model).items() if vi.type.tensor_type.elem_type in floats}


# metadata key of a model whose extra outputs are only observed (layerwise): an engine may read
# them another way than as outputs (TensorRT's debug tensors keep its fusions)
OBSERVE_KEY = "reprokit.observe"


def mark_outputs(model, names: list[str], known: dict | None = None):
    """Copy of the model with ``names`` added as graph outputs (types from shape inference, or
    from ``known``: value infos by name the caller has already)."""
    import onnx
    from onnx import helper

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    known = inferred_value_info(model) if known is None else known
    existing = {o.name for o in marked.graph.output}
    for name in names:
        if name in existing:
            continue
        if name in known:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(known[name])
        else:
            vi = helper.make_empty_tensor_value_info(name)
        marked.graph.output.append(vi)
        existing.add(name)
    return marked
