"""Explicit-precision models: a file that states fp16/bf16 itself (ModelOpt AutoCast,
onnxconverter-common) read back as float32, with the nodes the storage emulation must keep wide,
so ``emulate_model`` rounds exactly the tensors the file declares narrow.

Standalone, like ``emulation.py``: report archives embed it verbatim in ``repro.py``, just below
``names.py`` and ``emulation.py``, whose names it reads (the marked imports are dropped there).
Must not run an engine or decide which precision a target wants.
"""

from __future__ import annotations

import numpy as np

from reprokit.standalone.emulation import CannotEmulate, _inferred, _subgraphs  # noqa: I001  # repro.py: embedded above
from reprokit.standalone.names import FreshNames  # repro.py: embedded above

_NARROW_LABEL = {10: "fp16", 16: "bf16"}  # TensorProto.FLOAT16, TensorProto.BFLOAT16
_TYPE_ATTRS = {
    "Cast": "to",
    "RandomNormal": "dtype",
    "RandomUniform": "dtype",
    "RandomNormalLike": "dtype",
    "RandomUniformLike": "dtype",
    "EyeLike": "dtype",
    "Bernoulli": "dtype",
}


def widen_declared(model):
    """An explicit-precision model (fp16/bf16 stated in the file, as ModelOpt AutoCast or
    onnxconverter-common write it) read back as float32, with what :func:`emulate_model` needs to
    store in the narrow type exactly the tensors the file declares narrow, and nothing else.

    Returns ``(wide copy, "fp16" | "bf16" | None, keep)``: ``keep`` names the nodes whose outputs
    the file declares wide (its Casts back to float32, nodes left in float32), so
    ``emulate_model(wide, narrow, keep)`` rounds only the narrow ones. Unnamed nodes get names in
    the copy. Narrow values widen exactly. CannotEmulate for a file holding both fp16 and bf16, or
    control flow (a body's types are not read here).
    """
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    if any(True for n in model.graph.node for _ in _subgraphs(n)):
        raise CannotEmulate("typed emulation does not read If/Loop/Scan bodies")
    inferred = _inferred(model)
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in list(inferred.graph.input)
        + list(inferred.graph.value_info)
        + list(inferred.graph.output)
        if vi.type.HasField("tensor_type")
    }
    types.update({init.name: init.data_type for init in model.graph.initializer})
    seen = {_NARROW_LABEL[t] for t in types.values() if t in _NARROW_LABEL}
    seen |= {
        _NARROW_LABEL[a.i]
        for n in model.graph.node
        for a in n.attribute
        if a.name == _TYPE_ATTRS.get(n.op_type) and a.i in _NARROW_LABEL
    }
    if len(seen) > 1:
        raise CannotEmulate("the model declares both fp16 and bf16 tensors")
    pool = FreshNames.of(model)
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = pool.fresh(f"{node.op_type}_{index}")
    keep = frozenset(
        n.name for n in model.graph.node if not any(types.get(o) in _NARROW_LABEL for o in n.output)
    )

    def widened(tensor):
        if tensor.data_type in _NARROW_LABEL:
            tensor.CopyFrom(
                numpy_helper.from_array(
                    numpy_helper.to_array(tensor).astype(np.float32), tensor.name
                )
            )

    for init in model.graph.initializer:
        widened(init)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == attr.TENSOR:
                widened(attr.t)
            elif attr.name == _TYPE_ATTRS.get(node.op_type) and attr.i in _NARROW_LABEL:
                attr.i = TensorProto.FLOAT
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.tensor_type.elem_type in _NARROW_LABEL:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    del model.graph.value_info[:]
    return model, (seen.pop() if seen else None), keep
