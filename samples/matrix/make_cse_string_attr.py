"""A real onnxruntime regression that a later release fixed: with graph optimizations on, common
subexpression elimination hashes every tensor attribute and refuses string tensors ("Unexpected
tensor string type"), so a model with two identical string-valued LabelEncoders no longer loads
(microsoft/onnxruntime#28413). Measured here: onnxruntime 1.24.4 loads it; 1.25.0, 1.25.1 and
1.26.0 fail at session creation under ORT_ENABLE_ALL (ORT_DISABLE_ALL works); 1.27.0 and later
load it again. reprokit's target ``ort:opt`` against the reference ``ort`` shows it as a build
error; ``reprokit verify --versions 'onnxruntime>=1.24' --bisect`` finds both ends.

    x[4] int64 -> LabelEncoder(ints -> strings) -> s1 -\\
               -> LabelEncoder(same attributes)  -> s2 --> Equal -> y[4] bool

    python samples/matrix/make_cse_string_attr.py DIR   # DIR/cse_string_attr.onnx, .inputs.npz
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper


def build() -> onnx.ModelProto:
    attributes = dict(domain="ai.onnx.ml",
                      keys_tensor=helper.make_tensor("keys", TensorProto.INT64, [3], [1, 2, 3]),
                      values_tensor=helper.make_tensor("values", TensorProto.STRING, [3], [b"a", b"b", b"a"]),
                      default_tensor=helper.make_tensor("default", TensorProto.STRING, [1], [b"z"]))
    nodes = [helper.make_node("LabelEncoder", ["x"], ["s1"], name="encode_1", **attributes),
             helper.make_node("LabelEncoder", ["x"], ["s2"], name="encode_2", **attributes),
             helper.make_node("Equal", ["s1", "s2"], ["y"], name="same")]
    graph = helper.make_graph(nodes, "cse_string_attr",
                              [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, [4])])
    model = helper.make_model(graph, producer_name="reprokit-samples",
                              opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("ai.onnx.ml", 4)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.array([1, 2, 3, 9], np.int64)}


def write(folder: str) -> tuple[str, str]:
    os.makedirs(folder, exist_ok=True)
    model_path = os.path.join(folder, "cse_string_attr.onnx")
    inputs_path = os.path.join(folder, "cse_string_attr.inputs.npz")
    onnx.save(build(), model_path)
    np.savez(inputs_path, **feeds())
    return model_path, inputs_path


if __name__ == "__main__":
    print(*write(sys.argv[1] if len(sys.argv) > 1 else "."), sep="\n")
