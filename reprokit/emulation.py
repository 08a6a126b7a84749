"""fp16/bf16 storage emulation as a pure model rewrite: numpy, onnx and ml_dtypes only.

Kept free of reprokit imports on purpose: report archives embed this file verbatim in their
standalone ``repro.py``, so the repro computes exactly what reprokit computed.
"""

from __future__ import annotations

import numpy as np

NARROW = {"fp16": "float16", "bf16": "bfloat16"}


def round_through(array: np.ndarray, narrow: str) -> np.ndarray:
    """Round a float32 array through fp16/bf16 and back (numpy, no engine)."""
    if array.dtype != np.float32:
        return array
    if narrow == "fp16":
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16).astype(np.float32)


def emulate_model(model, narrow: str, keep_fp32: frozenset[str] = frozenset()):
    """Return a copy of ``model`` whose float storage is rounded through ``narrow``.

    ``keep_fp32`` names nodes whose outputs stay fp32 (the "keep this layer in FP32" knob);
    weights that only such nodes read stay fp32 too. Tensor names are unchanged: each float
    output or weight ``t`` is produced as ``t`` by a Cast pair fed from a renamed wide copy.
    Weights are rounded by Casts in the graph, never loaded here, so a model whose weights are
    external data is rewritten without reading them.
    """
    import onnx
    from onnx import TensorProto, helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if narrow == "bf16" and opset < 13:
        # Cast to bfloat16 exists from opset 13 on: lift the (emulated copy of the) model there.
        from onnx import version_converter

        model = version_converter.convert_version(model, 13)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort; unknown types are left wide
        inferred = model
    graph = model.graph
    float_names = {
        vi.name
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    narrow_type = TensorProto.FLOAT16 if narrow == "fp16" else TensorProto.BFLOAT16
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    graph_inputs = {vi.name: vi for vi in graph.input}
    new_nodes = []
    for init in graph.initializer:
        name = init.name
        if init.data_type != TensorProto.FLOAT or (readers.get(name) and readers[name] <= keep_fp32):
            continue
        wide, mid = f"{name}__rk_wide", f"{name}__rk_narrow"
        init.name = wide
        if name in graph_inputs:  # old models list weights among the inputs too
            graph_inputs[name].name = wide
        new_nodes.append(helper.make_node("Cast", [wide], [mid], to=narrow_type, name=mid))
        new_nodes.append(helper.make_node("Cast", [mid], [name], to=TensorProto.FLOAT, name=name + "__rk_cast"))
    for index, node in enumerate(graph.node):
        new_nodes.append(node)
        if node.name in keep_fp32:
            continue
        for slot, name in enumerate(node.output):
            if not name or name not in float_names:
                continue
            wide, mid = f"{name}__rk_wide{index}", f"{name}__rk_narrow{index}"
            node.output[slot] = wide
            new_nodes.append(helper.make_node("Cast", [wide], [mid], to=narrow_type, name=mid))
            new_nodes.append(helper.make_node("Cast", [mid], [name], to=TensorProto.FLOAT, name=name + "__rk_cast"))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return model
