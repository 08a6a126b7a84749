"""Tiny ONNX models for reading TensorRT's ONNX-parser layer names: writes them, and the polygraphy
postprocess script pin.py, into the folder given (default: the current one). Prepared here, carried
to the GPU machine, read there by scripts/trt_layer_names.py (tests/golden/trt_layer_names.txt)."""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
rng = np.random.default_rng(0)


def save(name, nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, name, inputs, outputs, list(inits))
    m = h.make_model(g, ir_version=8, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(OUT, f"{name}.onnx"))


def vi(n, s):
    return h.make_tensor_value_info(n, T.FLOAT, s)


def arr(n, s):
    return nh.from_array(rng.standard_normal(s).astype(np.float32), n)


# x -> Mul(unnamed, x*k) -> y
save(
    "unnamed_mul",
    [h.make_node("Mul", ["x", "k"], ["y"])],
    [vi("x", [2, 8])],
    [vi("y", [2, 8])],
    [arr("k", [8])],
)
# x -> LayerNormalization "ln" -> y
save(
    "layernorm",
    [h.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-1)],
    [vi("x", [2, 4, 8])],
    [vi("y", [2, 4, 8])],
    [arr("g", [8]), arr("b", [8])],
)
# x -> Gemm "fc" (bias, transB) -> y
save(
    "gemm_bias",
    [h.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc", transB=1)],
    [vi("x", [2, 8])],
    [vi("y", [2, 4])],
    [arr("w", [4, 8]), arr("c", [4])],
)
# x -> Softmax "sm" -> y
save(
    "softmax",
    [h.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)],
    [vi("x", [2, 8])],
    [vi("y", [2, 8])],
)
# x -> ReduceMean "rm" (axes input, opset 18) -> y ; GroupNormalization lowers to several layers
save(
    "groupnorm",
    [h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2)],
    [vi("x", [1, 4, 3, 3])],
    [vi("y", [1, 4, 3, 3])],
    [arr("s", [4]), arr("b", [4])],
    opset=21,
)
# x -> LayerNormalization "ln" -> LayerNormalization "ln_1" -> Gemm "ln_2" -> Mul(unnamed) -> y
save(
    "prefix",
    [
        h.make_node("LayerNormalization", ["x", "g", "b"], ["t1"], name="ln", axis=-1),
        h.make_node("LayerNormalization", ["t1", "g", "b"], ["t2"], name="ln_1", axis=-1),
        h.make_node("Gemm", ["t2", "w", "c"], ["t3"], name="ln_2", transB=1),
        h.make_node("Mul", ["t3", "k"], ["y"]),
    ],
    [vi("x", [2, 8])],
    [vi("y", [2, 8])],
    [arr("g", [8]), arr("b", [8]), arr("w", [8, 8]), arr("c", [8]), arr("k", [8])],
)
with open(
    os.path.join(OUT, "pin.py"), "w"
) as handle:  # polygraphy --trt-network-postprocess-script
    handle.write(
        "def postprocess(network):\n    import re\n    for layer in network:\n"
        "        m = re.search(r'\\[ONNX Layer: (.*?)\\]', layer.metadata or '')\n"
        "        print('npps saw', layer.name, m.group(1) if m else None)\n"
    )
