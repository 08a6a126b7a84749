"""Tiny ONNX model generators for the tests.

Each generator returns an ``onnx.ModelProto`` (IR 8, opset 17: onnxruntime here reads IR <= 13)
and carries a one-line diagram of its graph. ``save(model, path)`` writes it and returns the path.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


def make(nodes, inputs, outputs, initializers=(), name="g") -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path, **kwargs) -> str:
    path = os.fspath(path)
    onnx.save(model, path, **kwargs)
    return path


def const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def vi(name: str, shape, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def small_mlp(n: int = 8, m: int = 4) -> onnx.ModelProto:
    """Small values everywhere: fp16/bf16 storage changes nothing that matters."""
    # x[1,n] -> MatMul(W[n,m]) -> h -> Add(b) -> a -> Relu -> y[1,m]
    rng = np.random.default_rng(1)
    w = rng.uniform(-0.5, 0.5, size=(n, m))
    b = rng.uniform(0.1, 0.2, size=(m,))
    return make(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
            helper.make_node("Add", ["h", "b"], ["a"], name="add"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        [vi("x", [1, n])],
        [vi("y", [1, m])],
        [const("W", w), const("b", b)],
    )


def matmul_overflow(n: int = 16, weight: float = 3e4) -> onnx.ModelProto:
    """x in [0,1) summed against weights of 3e4: the MatMul output (~2.4e5) passes fp16's 65504."""
    # x[1,n] -> MatMul(W = 3e4 * ones[n,4]) -> y[1,4]   (fp16 storage: y = inf)
    return make(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        [vi("x", [1, n])],
        [vi("y", [1, 4])],
        [const("W", np.full((n, 4), weight))],
    )


def matmul_overflow_softmax(n: int = 16, weight: float = 3e4) -> onnx.ModelProto:
    """The overflowing MatMul feeds a Softmax: inf - inf inside it gives NaN."""
    # x[1,n] -> MatMul(W = 3e4 * ones[n,4]) -> h (inf in fp16) -> Softmax -> y[1,4] (nan)
    return make(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
            helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1),
        ],
        [vi("x", [1, n])],
        [vi("y", [1, 4])],
        [const("W", np.full((n, 4), weight))],
    )


def cancellation(big: float = 1e4) -> onnx.ModelProto:
    """Add a big bias then subtract it: fp16's spacing at 1e4 is 8, so x in [0,1) is lost."""
    # x[1,16] -> Add(1e4) -> h -> Sub(1e4) -> y[1,16]
    return make(
        [
            helper.make_node("Add", ["x", "big"], ["h"], name="add_big"),
            helper.make_node("Sub", ["h", "big"], ["y"], name="sub_big"),
        ],
        [vi("x", [1, 16])],
        [vi("y", [1, 16])],
        [const("big", np.float32(big))],
    )


def bf16_steps(n: int = 256) -> onnx.ModelProto:
    """A MatMul whose weights are 1 + k*1e-3: bf16 (8-bit mantissa, spacing 2**-7 near 1) rounds
    them all to 1, so the alternating-sign reduction that cancels the ones loses its signal."""
    # x[1,n] -> MatMul(W[n,1] = (-1)^k (1 + k*1e-3)) -> y[1,1]
    k = np.arange(n)
    w = ((-1.0) ** k) * (1.0 + k * 1e-3)
    return make(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        [vi("x", [1, n])],
        [vi("y", [1, 1])],
        [const("W", w.reshape(n, 1))],
    )


def log_model() -> onnx.ModelProto:
    """Log: negative inputs give NaN in the reference itself."""
    # x[1,8] -> Log -> y[1,8]
    return make(
        [helper.make_node("Log", ["x"], ["y"], name="log")],
        [vi("x", [1, 8])],
        [vi("y", [1, 8])],
    )


def planted_overflow(up: float = 1e5) -> onnx.ModelProto:
    """A chain with one overflowing node in the middle ("boom": x*1e5 passes fp16's max; with a
    smaller ``up`` only large inputs do)."""
    # x[1,8] -> Add(0.5) "pre" -> a -> Mul(up) "boom" -> b -> Mul(1/up) "back" -> c -> Relu "post" -> y
    return make(
        [
            helper.make_node("Add", ["x", "half"], ["a"], name="pre"),
            helper.make_node("Mul", ["a", "up"], ["b"], name="boom"),
            helper.make_node("Mul", ["b", "down"], ["c"], name="back"),
            helper.make_node("Relu", ["c"], ["y"], name="post"),
        ],
        [vi("x", [1, 8])],
        [vi("y", [1, 8])],
        [
            const("half", np.float32(0.5)),
            const("up", np.float32(up)),
            const("down", np.float32(1 / up)),
        ],
    )


def dynamic_relu() -> onnx.ModelProto:
    """Dynamic batch and spatial dims, a static channel dim of 3."""
    # x[N,3,H,W] -> Relu -> y[N,3,H,W]
    return make(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [vi("x", ["N", 3, "H", "W"])],
        [vi("y", ["N", 3, "H", "W"])],
    )


def two_inputs() -> onnx.ModelProto:
    """Two inputs of different dtypes: a float tensor and an int64 tensor cast and added."""
    # (x[2,3] float, k[2,3] int64 -> Cast(float)) -> Add -> y[2,3]
    return make(
        [
            helper.make_node("Cast", ["k"], ["kf"], name="cast", to=FLOAT),
            helper.make_node("Add", ["x", "kf"], ["y"], name="add"),
        ],
        [vi("x", [2, 3]), vi("k", [2, 3], TensorProto.INT64)],
        [vi("y", [2, 3])],
    )


def big_weights(n: int = 64) -> onnx.ModelProto:
    """A MatMul with a 16 KiB weight, big enough for onnx to store it as external data."""
    # x[1,n] -> MatMul(W[n,n]) -> y[1,n]
    w = np.random.default_rng(2).uniform(-0.1, 0.1, size=(n, n))
    return make(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")],
        [vi("x", [1, n])],
        [vi("y", [1, n])],
        [const("W", w)],
    )


def save_external(model: onnx.ModelProto, path, location: str = "weights.bin") -> str:
    """Save with every initializer in one external file ``location`` next to ``path``."""
    path = os.fspath(path)
    onnx.save(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )
    return path


def qdq_conv_chain(x_range: float = 0.5, blocks: int = 2, inner: float = 16.0) -> onnx.ModelProto:
    """A QDQ model as onnxruntime's quantize_static writes one (int8 activations, int8 per-channel
    weights), its input scale calibrated for |x| <= ``x_range``: uniform [0,1) feeds clip there."""
    # x[1,4,6,6] -> Q -> DQ -> Conv(DQ(Wq)) -> Q -> DQ -> Relu -> ... (``blocks`` times) -> Q -> DQ -> y
    rng = np.random.default_rng(7)
    nodes, inits = [], []

    def qdq(tensor: str, scale: float, tag: str) -> str:
        inits.extend([const(f"{tag}_scale", scale),
                      numpy_helper.from_array(np.array(0, np.int8), f"{tag}_zero")])
        nodes.append(helper.make_node("QuantizeLinear", [tensor, f"{tag}_scale", f"{tag}_zero"], [f"{tag}_q"],
                                      name=f"{tag}_QuantizeLinear"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{tag}_q", f"{tag}_scale", f"{tag}_zero"],
                                      [f"{tag}_dq"], name=f"{tag}_DequantizeLinear"))
        return f"{tag}_dq"

    current = qdq("x", x_range / 127, "x")
    for b in range(blocks):
        w = rng.uniform(-1, 1, size=(4, 4, 3, 3)).astype(np.float32)
        w_scale = np.abs(w).reshape(4, -1).max(axis=1) / 127
        inits.extend([numpy_helper.from_array(np.round(w / w_scale[:, None, None, None]).astype(np.int8), f"w{b}_q"),
                      numpy_helper.from_array(w_scale.astype(np.float32), f"w{b}_scale"),
                      numpy_helper.from_array(np.zeros(4, np.int8), f"w{b}_zero")])
        nodes.append(helper.make_node("DequantizeLinear", [f"w{b}_q", f"w{b}_scale", f"w{b}_zero"], [f"w{b}"],
                                      name=f"w{b}_DequantizeLinear", axis=0))
        nodes.append(helper.make_node("Conv", [current, f"w{b}"], [f"conv{b}"], name=f"conv{b}", pads=[1, 1, 1, 1]))
        current = qdq(f"conv{b}", inner / 127, f"conv{b}")
        nodes.append(helper.make_node("Relu", [current], [f"relu{b}"], name=f"relu{b}"))
        current = qdq(f"relu{b}", inner / 127, f"relu{b}")
    nodes.append(helper.make_node("Identity", [current], ["y"], name="out"))
    return make(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", [1, 4, 6, 6])], inits)


def qdq_small_scale() -> onnx.ModelProto:
    """One Q/DQ pair whose scale (1e-4/127) is an fp16 subnormal: rounded to fp16 it moves by 1.5%."""
    # x[1,64] -> QuantizeLinear(s = 1e-4/127, int8) -> DequantizeLinear -> y[1,64]
    scale, zero = const("s", 1e-4 / 127), numpy_helper.from_array(np.array(0, np.int8), "z")
    return make(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize"),
        ],
        [vi("x", [1, 64])],
        [vi("y", [1, 64])],
        [scale, zero],
    )


def conv_relu_conv(channels: int = 4, bias: bool = False) -> onnx.ModelProto:
    """A float CNN for quantize_static to quantize (the tests calibrate it themselves); ``bias``:
    the first Conv has a bias B1 (quantize_static quantizes it to int32 by default)."""
    # x[1,4,8,8] -> Conv(W1[, B1]) -> c1 -> Relu -> r1 -> Conv(W2) -> y[1,4,8,8]
    rng = np.random.default_rng(3)
    w1 = rng.uniform(-0.5, 0.5, (channels, channels, 3, 3))
    w2 = rng.uniform(-0.5, 0.5, (channels, channels, 3, 3))
    b1 = [const("B1", rng.uniform(-0.1, 0.1, channels))] if bias else []
    return make(
        [
            helper.make_node("Conv", ["x", "W1"] + (["B1"] if bias else []), ["c1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "W2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
        ],
        [vi("x", [1, channels, 8, 8])],
        [vi("y", [1, channels, 8, 8])],
        [const("W1", w1), const("W2", w2)] + b1,
    )


def qdq_zero_bias_add(n: int = 16) -> onnx.ModelProto:
    """quantize_static's pattern for a Linear layer whose bias is all zeros (a fresh init), every op
    quantized (uint8 activations): the bias is quantized as an activation, scale 1, zero point 0."""
    # x[1,4,n] -> Q/DQ -> MatMul(DQ(Wq)) -> Q/DQ -> Add(DQ(Q(bias = 0))) -> Q/DQ -> Relu -> Q/DQ -> y
    rng = np.random.default_rng(5)
    w = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    w_scale = np.float32(np.abs(w).max() / 127)
    inits = [
        numpy_helper.from_array(np.round(w / w_scale).astype(np.int8), "w_q"),
        const("w_scale", w_scale),
        numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
        const("bias", np.zeros(n)),
        const("bias_scale", 1.0),
        numpy_helper.from_array(np.array(0, np.uint8), "bias_zero"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"], name="w_DequantizeLinear"),
             helper.make_node("QuantizeLinear", ["bias", "bias_scale", "bias_zero"], ["bias_q"], name="bias_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["bias_q", "bias_scale", "bias_zero"], ["bias_dq"],
                              name="bias_DequantizeLinear")]

    def qdq(tensor: str, scale: float, zero: int) -> str:
        inits.extend([const(f"{tensor}_scale", scale), numpy_helper.from_array(np.array(zero, np.uint8), f"{tensor}_zero")])
        nodes.append(helper.make_node("QuantizeLinear", [tensor, f"{tensor}_scale", f"{tensor}_zero"], [f"{tensor}_q"],
                                      name=f"{tensor}_QuantizeLinear"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{tensor}_q", f"{tensor}_scale", f"{tensor}_zero"],
                                      [f"{tensor}_dq"], name=f"{tensor}_DequantizeLinear"))
        return f"{tensor}_dq"

    x = qdq("x", 2.0 / 255, 0)
    nodes.append(helper.make_node("MatMul", [x, "w"], ["mm"], name="matmul"))
    mm = qdq("mm", 8.0 / 255, 128)
    nodes.append(helper.make_node("Add", ["bias_dq", mm], ["add"], name="add"))
    add = qdq("add", 8.0 / 255, 128)
    nodes.append(helper.make_node("Relu", [add], ["relu"], name="relu"))
    relu = qdq("relu", 4.0 / 255, 0)
    nodes.append(helper.make_node("Identity", [relu], ["y"], name="out"))
    return make(nodes, [vi("x", [1, 4, n])], [vi("y", [1, 4, n])], inits)




def qdq_chain_zero_bias_add(blocks: int = 16, at: int = 11, n: int = 8, zero: bool = True) -> onnx.ModelProto:
    """A residual stack of quantized MatMul layers as quantize_static writes it with every op
    quantized (int8 weights, uint8 activations): each stage's input QuantizeLinear is read by two
    DequantizeLinear nodes, one at the stage's start, one at its residual Add four layers later —
    a Q/DQ unit that spans the stage. After layer ``at``, :func:`qdq_zero_bias_add`'s Add of a
    quantized all-zero bias, which OpenVINO 2026.4 fails to compile (``zero=False``: none)."""
    # x -> Q -> DQ -> [MatMul(DQ(W_i)) -> Q/DQ] x 4 -> Add(., DQ(stage input's Q)) -> Q -> ... -> y
    #      (after layer ``at``: -> Add(., DQ(Q(bias = 0))) -> Q/DQ)
    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def quantize(tensor: str, scale: float, point: int) -> str:
        inits.extend([const(f"{tensor}_scale", scale), numpy_helper.from_array(np.array(point, np.uint8), f"{tensor}_zero")])
        nodes.append(helper.make_node("QuantizeLinear", [tensor, f"{tensor}_scale", f"{tensor}_zero"], [f"{tensor}_q"],
                                      name=f"{tensor}_QuantizeLinear"))
        return tensor

    def dequantize(tensor: str, reader: str = "") -> str:
        nodes.append(helper.make_node("DequantizeLinear", [f"{tensor}_q", f"{tensor}_scale", f"{tensor}_zero"],
                                      [f"{tensor}_dq{reader}"], name=f"{tensor}_DequantizeLinear{reader}"))
        return f"{tensor}_dq{reader}"

    stage = quantize("x", 4.0 / 255, 128)
    x = dequantize(stage)
    for i in range(blocks):
        w = rng.uniform(-1, 1, (n, n)).astype(np.float32) / np.sqrt(n)
        w_scale = np.float32(np.abs(w).max() / 127)
        inits.extend([numpy_helper.from_array(np.round(w / w_scale).astype(np.int8), f"w{i}_q"),
                      const(f"w{i}_scale", w_scale), numpy_helper.from_array(np.array(0, np.int8), f"w{i}_zero")])
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale", f"w{i}_zero"], [f"w{i}"],
                                      name=f"w{i}_DequantizeLinear"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"))
        x = dequantize(quantize(f"mm{i}", 8.0 / 255, 128))
        if zero and i + 1 == at:
            inits.append(const("bias", np.zeros(n)))
            bias = dequantize(quantize("bias", 1.0, 0))
            nodes.append(helper.make_node("Add", [bias, x], ["add"], name="add"))
            x = dequantize(quantize("add", 8.0 / 255, 128))
        if (i + 1) % 4 == 0:  # the residual Add: the stage input's second DequantizeLinear
            nodes.append(helper.make_node("Add", [x, dequantize(stage, "_skip")], [f"res{i}"], name=f"res{i}"))
            stage = quantize(f"res{i}", 8.0 / 255, 128)
            x = dequantize(stage)
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    return make(nodes, [vi("x", [1, 4, n])], [vi("y", [1, 4, n])], inits)
