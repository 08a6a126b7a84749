"""A real onnxruntime CPU operator bug, introduced and later fixed: AveragePool-19 with
count_include_pad=1 leaves the END padding out of the divisor (microsoft/onnxruntime#24681).
Measured here on x = arange: onnxruntime 1.20.1 agrees with onnx's ReferenceEvaluator and
OpenVINO; ``reprokit verify --versions 'onnxruntime>=1.17' --bisect`` on the archive names 1.21.0
as the first release that reproduces and 1.25.0 as the first fixed one (docs/matrix.md).
reprokit shows it as the target ``ort`` against the reference ``openvino:f32``, packed on a
release that has the bug (1.24.4).

    x[1,1,6,2] -> AveragePool-19(kernel 5x1, SAME_LOWER, count_include_pad) -> y[1,1,6,2]

    python samples/matrix/make_avgpool19_end_pad.py DIR   # DIR/avgpool19_end_pad.onnx, .inputs.npz
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper


def build() -> onnx.ModelProto:
    node = helper.make_node("AveragePool", ["x"], ["y"], name="avgpool", kernel_shape=[5, 1], auto_pad="SAME_LOWER",
                            count_include_pad=1)
    graph = helper.make_graph([node], "avgpool19_end_pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], producer_name="reprokit-samples")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds() -> dict[str, np.ndarray]:
    return {"x": np.arange(12, dtype=np.float32).reshape(1, 1, 6, 2)}  # the input


def write(folder: str) -> tuple[str, str]:
    os.makedirs(folder, exist_ok=True)
    model_path = os.path.join(folder, "avgpool19_end_pad.onnx")
    inputs_path = os.path.join(folder, "avgpool19_end_pad.inputs.npz")
    onnx.save(build(), model_path)
    np.savez(inputs_path, **feeds())
    return model_path, inputs_path


if __name__ == "__main__":
    print(*write(sys.argv[1] if len(sys.argv) > 1 else "."), sep="\n")
