"""A real onnxruntime CPU bug that a later release fixed: AveragePool (opset 7-18, the float MLAS
path) with ceil_mode=1 and count_include_pad=1 divides the trailing window by the full kernel
size, phantom cells past the padding included (microsoft/onnxruntime#16203, pytorch#183528;
fixed by microsoft/onnxruntime#29629). onnxruntime 1.28.0 gives 3.0 where the specification,
onnx's ReferenceEvaluator, OpenVINO and onnxruntime >= 1.29.0 give 3.5 on the issue's input.

    x[1,2,9] -> AveragePool(kernel 7, stride 3, pads 3/3, ceil_mode, count_include_pad) -> y[1,2,4]

    python samples/matrix/make_avgpool_ceil.py DIR   # writes DIR/avgpool_ceil.onnx and .inputs.npz
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper


def build() -> onnx.ModelProto:
    node = helper.make_node("AveragePool", ["x"], ["y"], name="avgpool", kernel_shape=[7], strides=[3],
                            pads=[3, 3], ceil_mode=1, count_include_pad=1)
    graph = helper.make_graph([node], "avgpool_ceil",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="reprokit-samples")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds() -> dict[str, np.ndarray]:
    # the input of onnxruntime#16203: the trailing window then holds 2 real cells and 3 of padding
    x = np.array([[2.0903, 4.6493, 1.6320, -3.2051, 4.6975, 4.7296, 3.3653, -1.5815, -2.3832],
                  [0.9628, -1.5899, -2.6820, 5.7529, 7.7346, -0.8910, -2.0151, 0.1313, -0.5374]], np.float32)
    return {"x": x[None]}


def write(folder: str) -> tuple[str, str]:
    os.makedirs(folder, exist_ok=True)
    model_path = os.path.join(folder, "avgpool_ceil.onnx")
    inputs_path = os.path.join(folder, "avgpool_ceil.inputs.npz")
    onnx.save(build(), model_path)
    np.savez(inputs_path, **feeds())
    return model_path, inputs_path


if __name__ == "__main__":
    print(*write(sys.argv[1] if len(sys.argv) > 1 else "."), sep="\n")
