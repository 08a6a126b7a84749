"""Element types and values for the float32 → fp16/bf16 conversion: the narrow types, which ops
pick their output type by an attribute, and float32 values rounded into a narrow TensorProto.

Must not know about graphs or scopes: it converts single values.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

NARROW_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
TYPE_STR = {TensorProto.FLOAT16: "tensor(float16)", TensorProto.BFLOAT16: "tensor(bfloat16)"}
FLOAT = TensorProto.FLOAT
WIDE, NARROW = "fp32", "narrow"

# Ops whose float output type is picked by an attribute: (attribute, its default output type).
TYPE_ATTR = {
    "Cast": ("to", None),
    "ConstantOfShape": ("value", FLOAT),
    "RandomNormal": ("dtype", FLOAT),
    "RandomUniform": ("dtype", FLOAT),
    "RandomNormalLike": ("dtype", None),
    "RandomUniformLike": ("dtype", None),
    "EyeLike": ("dtype", None),
    "Bernoulli": ("dtype", None),
}
# Inputs that are read whatever their float type: a Cast in front would only lose precision.
ANY_INPUT = {"Cast": {0}, "CastLike": {0}, "Shape": {0}, "Size": {0}}


def narrow_tensor(array: np.ndarray, name: str, narrow: int) -> TensorProto:
    """A narrow TensorProto of float32 ``array``; finite values past the range are clamped."""
    array = np.asarray(array, dtype=np.float32)
    if narrow == TensorProto.FLOAT16:
        limit = float(np.finfo(np.float16).max)
        clamped = np.where(np.isfinite(array), np.clip(array, -limit, limit), array)
        return numpy_helper.from_array(clamped.astype(np.float16), name)
    import ml_dtypes

    limit = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    clamped = np.where(np.isfinite(array), np.clip(array, -limit, limit), array)
    bits = clamped.astype(ml_dtypes.bfloat16).view(np.uint16)
    return helper.make_tensor(name, narrow, array.shape, bits.tobytes(), raw=True)


def constant_value(node) -> np.ndarray | None:
    """The float32 value of a Constant node, or None when it is not float32."""
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type == FLOAT:
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(attr.floats, dtype=np.float32)
    return None
