#!/usr/bin/env python
"""Generate reprokit's sample models: five seed-like ONNX graphs that fail under fp16.

    python samples/make_samples.py [--out samples/]

Each model is built with ``onnx.helper`` and numpy (fixed seeds, no torch), so every run writes
byte-identical files: ``<name>.onnx``, ``<name>.inputs.npz`` (random feeds, seed 0, drawn the
way reprokit draws its default feeds) and ``catalog.json``.

Every model is opset 17 / IR 8, has static float32 inputs, gives finite outputs on the
onnxruntime fp32 reference, and carries one planted fault that the *weights* cause, so it shows
for any input drawn uniform in [0, 1). See samples/README.md for what each one mimics and the
measured verdicts (samples/measure.py re-measures them).
"""

from __future__ import annotations

import argparse
import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # onnxruntime 1.31 refuses onnx 1.23's default IR 14
FEED_SEED = 0
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------
# graph building helpers
# --------------------------------------------------------------------------------------------


class Builder:
    """Accumulates nodes and initializers; every node gets a name and ``<name>_output_<i>``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}

    # ---- tensors ----------------------------------------------------------------------------
    def init(self, name: str, array) -> str:
        if name in self._names:
            raise ValueError(f"duplicate name {name}")
        self._names.add(name)
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, values, dtype=np.float32) -> str:
        """A shared small constant (axes, shapes, exponents, clip bounds)."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            kind = "i" if array.dtype.kind == "i" else "f"
            self._consts[key] = self.init(f"const_{kind}{len(self._consts)}", array)
        return self._consts[key]

    def weight(self, name: str, shape, fan_in: int, gain: float = 1.0) -> str:
        std = np.float32(gain / np.sqrt(fan_in))
        return self.init(name, self.rng.standard_normal(shape, dtype=np.float32) * std)

    def bias(self, name: str, n: int, scale: float = 0.05) -> str:
        return self.init(name, self.rng.standard_normal(n, dtype=np.float32) * np.float32(scale))

    # ---- nodes ------------------------------------------------------------------------------
    def op(self, op_type: str, name: str, inputs, n_out: int = 1, **attrs):
        if name in self._names:
            raise ValueError(f"duplicate name {name}")
        self._names.add(name)
        outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    # ---- common layers ----------------------------------------------------------------------
    def linear(self, prefix: str, x: str, d_in: int, d_out: int, gain: float = 1.0) -> str:
        w = self.weight(f"{prefix}.weight", (d_in, d_out), d_in, gain)
        b = self.bias(f"{prefix}.bias", d_out)
        y = self.op("MatMul", f"{prefix}/matmul", [x, w])
        return self.op("Add", f"{prefix}/add", [y, b])

    def conv(self, prefix: str, x: str, c_in: int, c_out: int, k: int = 3, stride: int = 1,
             group: int = 1, bias: bool = True, gain: float = 1.0, bias_scale: float = 0.05,
             name: str | None = None) -> str:
        fan_in = (c_in // group) * k * k
        w = self.weight(f"{prefix}.weight", (c_out, c_in // group, k, k), fan_in, gain)
        inputs = [x, w]
        if bias:
            inputs.append(self.bias(f"{prefix}.bias", c_out, bias_scale))
        pad = (k - 1) // 2
        return self.op("Conv", name or f"{prefix}/conv", inputs, kernel_shape=[k, k],
                       strides=[stride, stride], pads=[pad] * 4, group=group)

    def build(self, name: str, inputs: list[tuple[str, list[int]]], outputs: list[str],
              doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="reprokit-samples",
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        # fill in the output shapes so every consumer sees a fully typed graph
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        return model


@dataclass
class Sample:
    name: str
    model: onnx.ModelProto
    description: str
    mimics: str
    fault_node: str
    fault_op: str
    keep_fp32: list[str]  # fault node + closely related nodes whose fp32 output cures the fault
    expected: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# (a) attention_softmax_nan: SuperGlue-like attentional GNN, Q.K^T past 65504 in one layer
# --------------------------------------------------------------------------------------------

N0, N1, D, HEADS = 64, 48, 32, 4
DH = D // HEADS


def _attention(b: Builder, p: str, x: str, src: str, n: int, m: int, plant: int | None) -> str:
    """Multi-head attention of ``x`` ([1,n,D]) over ``src`` ([1,m,D]); torch-export style."""
    wq = b.rng.standard_normal((D, D), dtype=np.float32) * np.float32(1 / np.sqrt(D))
    wk = b.rng.standard_normal((D, D), dtype=np.float32) * np.float32(1 / np.sqrt(D))
    bq = b.rng.standard_normal(D, dtype=np.float32) * np.float32(0.05)
    bk = b.rng.standard_normal(D, dtype=np.float32) * np.float32(0.05)
    if plant is not None:
        # One channel of one head carries a large input-independent component in both Q and K:
        # q.k gains 181 * 512 = 92672 > 65504 for every query/key pair, whatever the input.
        # 512 and 181 (= 512 * fp16(1/sqrt(8))) are exact in fp16, so nothing but the logits'
        # own storage is at stake.
        col = plant * DH + DH - 1
        heads = slice(plant * DH, col)
        wq[:, heads] *= 4.0  # and the head attends sharply (in fp32)
        wk[:, heads] *= 4.0
        wq[:, col] = 0.0
        wk[:, col] = 0.0
        bq[col] = 512.0
        bk[col] = 512.0
    q = b.op("Add", f"{p}/q_proj/add", [b.op("MatMul", f"{p}/q_proj/matmul",
                                               [x, b.init(f"{p}.q_proj.weight", wq)]),
                                        b.init(f"{p}.q_proj.bias", bq)])
    k = b.op("Add", f"{p}/k_proj/add", [b.op("MatMul", f"{p}/k_proj/matmul",
                                               [src, b.init(f"{p}.k_proj.weight", wk)]),
                                        b.init(f"{p}.k_proj.bias", bk)])
    v = b.linear(f"{p}/v_proj", src, D, D)
    q = b.op("Reshape", f"{p}/q_reshape", [q, b.const([1, n, HEADS, DH], np.int64)])
    k = b.op("Reshape", f"{p}/k_reshape", [k, b.const([1, m, HEADS, DH], np.int64)])
    v = b.op("Reshape", f"{p}/v_reshape", [v, b.const([1, m, HEADS, DH], np.int64)])
    q = b.op("Transpose", f"{p}/q_transpose", [q], perm=[0, 2, 1, 3])  # [1,H,n,dh]
    k = b.op("Transpose", f"{p}/k_transpose", [k], perm=[0, 2, 3, 1])  # [1,H,dh,m]
    v = b.op("Transpose", f"{p}/v_transpose", [v], perm=[0, 2, 1, 3])  # [1,H,m,dh]
    q = b.op("Mul", f"{p}/q_scale", [q, b.const(1 / np.sqrt(DH))])
    logits = b.op("MatMul", f"{p}/qk_matmul", [q, k])  # [1,H,n,m]
    attn = b.op("Softmax", f"{p}/softmax", [logits], axis=-1)
    o = b.op("MatMul", f"{p}/av_matmul", [attn, v])  # [1,H,n,dh]
    o = b.op("Transpose", f"{p}/o_transpose", [o], perm=[0, 2, 1, 3])
    o = b.op("Reshape", f"{p}/o_reshape", [o, b.const([1, n, D], np.int64)])
    wo = b.rng.standard_normal((D, D), dtype=np.float32) * np.float32(1 / np.sqrt(D))
    if plant is not None:
        wo[plant * DH:(plant + 1) * DH] *= 6.0  # the planted head dominates the message
    o = b.op("MatMul", f"{p}/o_proj/matmul", [o, b.init(f"{p}.o_proj.weight", wo)])
    return b.op("Add", f"{p}/o_proj/add", [o, b.bias(f"{p}.o_proj.bias", D)])


def attention_softmax_nan() -> Sample:
    b = Builder(seed=101)
    x = {0: "descriptors0", 1: "descriptors1"}
    n = {0: N0, 1: N1}
    for i in (0, 1):
        x[i] = b.linear(f"kenc{i}", x[i], D, D, gain=2.0)
    kinds = ["self", "cross", "self", "cross"]
    fault = "layer2/self0/attn/qk_matmul"
    for layer, kind in enumerate(kinds):
        new = {}
        for i in (0, 1):
            p = f"layer{layer}/{kind}{i}"
            src = x[i] if kind == "self" else x[1 - i]
            plant = 1 if f"{p}/attn/qk_matmul" == fault else None
            msg = _attention(b, f"{p}/attn", x[i], src, n[i], n[i if kind == "self" else 1 - i],
                             plant)
            h = b.op("Concat", f"{p}/mlp/concat", [x[i], msg], axis=-1)
            h = b.linear(f"{p}/mlp/fc1", h, 2 * D, 2 * D)
            h = b.op("Relu", f"{p}/mlp/relu", [h])
            h = b.linear(f"{p}/mlp/fc2", h, 2 * D, D, gain=0.5)
            new[i] = b.op("Add", f"{p}/residual", [x[i], h])
        x = new
    md = {}
    w = b.weight("final_proj.weight", (D, D), D, gain=1.0)
    bias = b.bias("final_proj.bias", D)
    for i in (0, 1):
        md[i] = b.op("Add", f"final_proj{i}/add",
                     [b.op("MatMul", f"final_proj{i}/matmul", [x[i], w]), bias])
    md1t = b.op("Transpose", "match/transpose", [md[1]], perm=[0, 2, 1])
    sim = b.op("MatMul", "match/matmul", [md[0], md1t])
    sim = b.op("Mul", "match/scale", [sim, b.const(1 / np.sqrt(D))])
    # log-domain dual softmax (SuperGlue and LoFTR output log assignment scores)
    rows = b.op("LogSoftmax", "match/log_softmax_rows", [sim], axis=2)
    cols = b.op("LogSoftmax", "match/log_softmax_cols", [sim], axis=1)
    b.op("Add", "match/log_dual_softmax", [rows, cols])
    b.nodes[-1].output[0] = "log_scores"
    model = b.build("attention_softmax_nan",
                    [("descriptors0", [1, N0, D]), ("descriptors1", [1, N1, D])],
                    ["log_scores"], "SuperGlue-like attentional GNN (reprokit sample)")
    return Sample(
        name="attention_softmax_nan",
        model=model,
        description=(
            "SuperGlue-like attentional graph network: two descriptor sets, four alternating "
            "self/cross multi-head attention layers with MLP updates, log-domain dual-softmax "
            "matching. In layer2/self0 one head's Q and K share a large bias channel, so its Q.K^T logits "
            "are ~92700 (> fp16 max 65504): stored as fp16 they become inf and the Softmax "
            "computes inf - inf = NaN, which spreads to every output."),
        mimics=("NVIDIA/TensorRT#3952 'TensorRT model always return NaN output' (SuperGlue "
                "on Jetson Orin, TRT 8.6); also wang-xinyu/tensorrtx#843 (DETR attention logits "
                "grow past fp16 before Softmax)"),
        fault_node=fault,
        fault_op="MatMul",
        keep_fp32=[fault, "layer2/self0/attn/softmax"],
    )


# --------------------------------------------------------------------------------------------
# (b) layernorm_overflow: NAFNet-like U-net with decomposed LayerNorm2d, Pow overflows
# --------------------------------------------------------------------------------------------


def _layernorm2d(b: Builder, p: str, x: str, c: int) -> str:
    """LayerNorm over channels as torch exports NAFNet's LayerNorm2d: nine primitive nodes."""
    mu = b.op("ReduceMean", f"{p}/reduce_mean", [x], axes=[1], keepdims=1)
    d = b.op("Sub", f"{p}/sub", [x, mu])
    d2 = b.op("Pow", f"{p}/pow", [d, b.const(2.0)])
    var = b.op("ReduceMean", f"{p}/reduce_var", [d2], axes=[1], keepdims=1)
    ve = b.op("Add", f"{p}/add_eps", [var, b.const(1e-6)])
    std = b.op("Sqrt", f"{p}/sqrt", [ve])
    y = b.op("Div", f"{p}/div", [d, std])
    w = b.init(f"{p}.weight", (1 + 0.1 * b.rng.standard_normal((1, c, 1, 1))).astype(np.float32))
    bb = b.init(f"{p}.bias", (0.05 * b.rng.standard_normal((1, c, 1, 1))).astype(np.float32))
    y = b.op("Mul", f"{p}/mul", [y, w])
    return b.op("Add", f"{p}/add", [y, bb])


def _nafblock(b: Builder, p: str, inp: str, c: int, big: float | None = None) -> str:
    x = _layernorm2d(b, f"{p}/norm1", inp, c)
    x = b.conv(f"{p}/conv1", x, c, 2 * c, k=1)
    x = b.conv(f"{p}/conv2", x, 2 * c, 2 * c, k=3, group=2 * c)
    x1, x2 = b.op("Split", f"{p}/sg1/split", [x], n_out=2, axis=1)
    x = b.op("Mul", f"{p}/sg1/mul", [x1, x2])
    s = b.op("GlobalAveragePool", f"{p}/sca/pool", [x])
    s = b.conv(f"{p}/sca/conv", s, c, c, k=1)
    x = b.op("Mul", f"{p}/sca/mul", [x, s])
    if big is None:
        x = b.conv(f"{p}/conv3", x, c, c, k=1)
        beta = b.init(f"{p}.beta", np.full((1, c, 1, 1), 0.5, np.float32))
        gamma = b.init(f"{p}.gamma", np.full((1, c, 1, 1), 0.5, np.float32))
    else:
        # Planted: conv3 carries a +-1 per-channel bias and the layer scales are large, so the
        # residual stream leaving the first half is ~ +-big per channel: (x - mean)^2 ~ big^2
        # > 65504 at every pixel, for any input.
        w = b.weight(f"{p}/conv3.weight", (c, c, 1, 1), c)
        sign = np.where(b.rng.standard_normal(c) > 0, 1.0, -1.0).astype(np.float32)
        x = b.op("Conv", f"{p}/conv3/conv", [x, w, b.init(f"{p}/conv3.bias", sign)],
                 kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], group=1)
        beta = b.init(f"{p}.beta", np.full((1, c, 1, 1), big, np.float32))
        gamma = b.init(f"{p}.gamma", np.full((1, c, 1, 1), big, np.float32))
    x = b.op("Mul", f"{p}/beta_mul", [x, beta])
    y = b.op("Add", f"{p}/beta_add", [inp, x])
    x = _layernorm2d(b, f"{p}/norm2", y, c)
    x = b.conv(f"{p}/conv4", x, c, 2 * c, k=1)
    x1, x2 = b.op("Split", f"{p}/sg2/split", [x], n_out=2, axis=1)
    x = b.op("Mul", f"{p}/sg2/mul", [x1, x2])
    x = b.conv(f"{p}/conv5", x, c, c, k=1)
    x = b.op("Mul", f"{p}/gamma_mul", [x, gamma])
    return b.op("Add", f"{p}/gamma_add", [y, x])


def layernorm_overflow() -> Sample:
    b = Builder(seed=202)
    big = 400.0
    x = b.conv("intro", "image", 3, 16, k=3)
    enc = _nafblock(b, "encoder0", x, 16)
    x = b.conv("down0", enc, 16, 32, k=2, stride=2)
    x = _nafblock(b, "middle0", x, 32)
    x = _nafblock(b, "middle1", x, 32, big=big)
    # the up projection brings the x400 stream back to unit scale (weights / 400)
    x = b.conv("up0", x, 32, 64, k=1, bias=False, gain=1.0 / big)
    x = b.op("DepthToSpace", "up0/pixel_shuffle", [x], blocksize=2, mode="CRD")
    x = b.op("Add", "skip0/add", [x, enc])
    x = _nafblock(b, "decoder0", x, 16)
    x = b.conv("ending", x, 16, 3, k=3)
    b.op("Add", "global_residual", [x, "image"])
    b.nodes[-1].output[0] = "restored"
    model = b.build("layernorm_overflow", [("image", [1, 3, 32, 32])], ["restored"],
                    "NAFNet-like restoration U-net (reprokit sample)")
    fault = "middle1/norm2/pow"
    return Sample(
        name="layernorm_overflow",
        model=model,
        description=(
            "NAFNet-like image-restoration U-net (encoder, down, two middle blocks, pixel-shuffle "
            "up, skip, decoder) whose LayerNorm2d is exported decomposed (ReduceMean, Sub, Pow, "
            "ReduceMean, Add eps, Sqrt, Div, Mul, Add). In middle1 large layer scales make the "
            "residual stream ~+-400 per channel, so Pow(x - mean, 2) ~ 160000 overflows fp16 "
            "to inf: the variance is inf, the normalised output collapses to 0 and the block's "
            "FFN branch contributes only its biases (finite but wrong restored image)."),
        mimics=("NVIDIA/TensorRT#3897 'Abnormal fp16 inference results of TensorRT v10.0 ... "
                "NAFNet' (also #4338 NAFNet fp16 NaN and #2564 'fp16 mismatch----layernorm "
                "overflow')"),
        fault_node=fault,
        fault_op="Pow",
        keep_fp32=[fault, "middle1/norm2/reduce_var", "middle1/norm2/add_eps", "middle1/norm2/sqrt"],
    )


# --------------------------------------------------------------------------------------------
# (c) log_div_underflow: spectrogram mask net with a log-energy feature, no epsilon
# --------------------------------------------------------------------------------------------


def _resblock(b: Builder, p: str, x: str, c: int) -> str:
    h = b.conv(f"{p}/conv1", x, c, c, k=3)
    h = b.op("Relu", f"{p}/relu1", [h])
    h = b.conv(f"{p}/conv2", h, c, c, k=3, gain=0.5)
    h = b.op("Add", f"{p}/add", [x, h])
    return b.op("Relu", f"{p}/relu2", [h])


def log_div_underflow() -> Sample:
    b = Builder(seed=303)
    c, ce = 16, 8
    x = b.conv("stem", "spectrogram", 1, c, k=3)
    x = b.op("Relu", "stem/relu", [x])
    for i in range(5):
        x = _resblock(b, f"encoder{i}", x, c)
    # log-energy conditioning: energy = mean_f((g * sigmoid(proj(x)))^2), log without epsilon
    e = b.conv("energy/proj", x, c, ce, k=1)
    e = b.op("Sigmoid", "energy/sigmoid", [e])
    e = b.op("Mul", "energy/gain", [e, b.init("energy.gain", np.float32(1e-4))])
    e = b.op("Pow", "energy/pow", [e, b.const(2.0)])  # ~1e-9..1e-8: below fp16's 6e-8
    e = b.op("ReduceMean", "energy/reduce_mean", [e], axes=[2], keepdims=1)  # [1,ce,1,T]
    e = b.op("Log", "energy/log", [e])  # ~ -20 in fp32, log(0) = -inf in fp16
    e = b.op("Sub", "energy/center", [e, b.const(-19.5)])
    e = b.op("Mul", "energy/scale", [e, b.const(0.5)])
    e = b.conv("energy/film", e, ce, c, k=1)  # [1,c,1,T], broadcast over frequency
    x = b.op("Add", "energy/condition", [x, e])
    for i in range(5):
        x = _resblock(b, f"decoder{i}", x, c)
    m = b.conv("mask/conv", x, c, 1, k=3)
    m = b.op("Sigmoid", "mask/sigmoid", [m])
    b.op("Mul", "mask/apply", [m, "spectrogram"])
    b.nodes[-1].output[0] = "enhanced"
    model = b.build("log_div_underflow", [("spectrogram", [1, 1, 64, 48])], ["enhanced"],
                    "spectrogram mask estimator with log-energy conditioning (reprokit sample)")
    fault = "energy/log"
    return Sample(
        name="log_div_underflow",
        model=model,
        description=(
            "Speech-enhancement-like mask estimator on a spectrogram: ten residual conv blocks "
            "conditioned (FiLM-style broadcast Add) on a per-frame log-energy feature computed "
            "as Log(ReduceMean((1e-4 * sigmoid(proj(x)))^2)) with no epsilon. The squares are "
            "~1e-9..1e-8, below fp16's smallest subnormal (6e-8): they flush to 0, Log gives "
            "-inf, and the conditioning turns every output into NaN."),
        mimics=("fp16 epsilon/underflow reports: lucidrains/gateloop-transformer#4 (values "
                "~1e-8 become 0.0 in fp16), pyg-team/pytorch_geometric#2106 (EPS=1e-15 gives "
                "inf/nan in half precision), ROCm/AMDMIGraphX#2659 (epsilons vanish in FP16)"),
        fault_node=fault,
        fault_op="Log",
        keep_fp32=["energy/pow", "energy/reduce_mean", fault],
    )


# --------------------------------------------------------------------------------------------
# (d) conv_clip: MobileNetV2-like Conv+Clip stack, big conv offset cancelled before Clip(0,6)
# --------------------------------------------------------------------------------------------


def _inverted_residual(b: Builder, p: str, x: str, c_in: int, c_out: int, t: int = 4,
                       offset: float | None = None, empty_min: bool = False) -> str:
    ce = c_in * t
    zero, six = b.const(0.0), b.const(6.0)
    if offset is None:
        h = b.conv(f"{p}/expand", x, c_in, ce, k=1)
    else:
        # Planted: un-fused BatchNorm. The conv bias holds the running mean (10000, exact in
        # fp16) and the BN Sub removes it again; the signal left after the cancellation is
        # O(1), below the fp16 spacing at 10000 (8), so fp16 storage of the conv output
        # quantises it to {-8, 0, 8} and Clip(0, 6) makes that {0, 6}.
        w = b.weight(f"{p}/expand.weight", (ce, c_in, 1, 1), c_in, gain=2.0)
        bias = np.full(ce, offset, np.float32)
        h = b.op("Conv", f"{p}/expand/conv", [x, w, b.init(f"{p}/expand.bias", bias)],
                 kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], group=1)
        mean = b.init(f"{p}/bn.running_mean", np.full((1, ce, 1, 1), offset, np.float32))
        scale = (1.0 + 0.1 * b.rng.standard_normal((1, ce, 1, 1))).astype(np.float32)
        shift = (0.1 * b.rng.standard_normal((1, ce, 1, 1))).astype(np.float32)
        h = b.op("Sub", f"{p}/bn/sub_mean", [h, mean])
        h = b.op("Mul", f"{p}/bn/mul_scale", [h, b.init(f"{p}/bn.scale", scale)])
        h = b.op("Add", f"{p}/bn/add_shift", [h, b.init(f"{p}/bn.shift", shift)])
    h = b.op("Clip", f"{p}/expand/relu6", [h, zero, six])
    h = b.conv(f"{p}/dw", h, ce, ce, k=3, group=ce)
    if empty_min:
        # min(x, 6) only: Clip with the optional 'min' input left empty
        h = b.op("Clip", f"{p}/dw/clip_max", [h, "", six])
    else:
        h = b.op("Clip", f"{p}/dw/relu6", [h, zero, six])
    h = b.conv(f"{p}/project", h, ce, c_out, k=1, gain=0.7)
    if c_in == c_out:
        h = b.op("Add", f"{p}/add", [x, h])
    return h


def conv_clip() -> Sample:
    b = Builder(seed=404)
    x = b.conv("stem", "image", 3, 16, k=3)
    x = b.op("Clip", "stem/relu6", [x, b.const(0.0), b.const(6.0)])
    plan = [(16, 16), (16, 24), (24, 24), (24, 24), (24, 32), (32, 32),
            (32, 32), (32, 24), (24, 24), (24, 16), (16, 16)]
    fault_block = 7
    for i, (ci, co) in enumerate(plan):
        x = _inverted_residual(b, f"block{i}", x, ci, co,
                               offset=10000.0 if i == fault_block else None,
                               empty_min=(i == 2))
    x = b.conv("head", x, 16, 3, k=3)
    b.op("Clip", "head/clip", [x, b.const(-0.5), b.const(0.5)])
    b.nodes[-1].output[0] = "output"
    model = b.build("conv_clip", [("image", [1, 3, 64, 64])], ["output"],
                    "MobileNetV2-like Conv+Clip image-to-image net (reprokit sample)")
    fault = f"block{fault_block}/bn/sub_mean"
    return Sample(
        name="conv_clip",
        model=model,
        description=(
            "MobileNetV2-like image-to-image network: stem, eleven inverted-residual blocks "
            "(1x1 expand Conv, Clip(0,6), 3x3 depthwise Conv, Clip(0,6), 1x1 project Conv, "
            "residual Add where shapes allow) and a Conv + Clip(-0.5,0.5) head. In block7 "
            "(32->24 channels, no residual) the expand Conv has a 10000 bias that an un-fused "
            "BatchNorm (Sub running mean, Mul, Add) removes before Clip(0,6); with the Conv "
            "output stored in fp16 (spacing 8 at 10000) the O(1) signal is lost: a finite "
            "numeric mismatch, no NaN. block2 uses Clip(x, '', 6), an empty optional min "
            "input."),
        mimics=("NVIDIA/TensorRT#3938 'output result error of TensorRT 10.0.1.6 when running "
                "conv+clip structure on GPU NVIDIA L4'"),
        fault_node=fault,  # where the precision loss shows: the cancellation
        fault_op="Sub",
        keep_fp32=[f"block{fault_block}/expand/conv", f"block{fault_block}/bn/sub_mean"],  # the Conv and the Sub that reads it
    )


# --------------------------------------------------------------------------------------------
# (e) static_batch_broadcast: density/count net, [1,C,1,1] broadcast then ReduceSum > 65504
# --------------------------------------------------------------------------------------------


def _se_block(b: Builder, p: str, x: str, c: int) -> str:
    h = b.conv(f"{p}/conv1", x, c, c, k=3)
    h = b.op("Relu", f"{p}/relu1", [h])
    h = b.conv(f"{p}/conv2", h, c, c, k=3, gain=0.5)
    s = b.op("GlobalAveragePool", f"{p}/se/pool", [h])  # [1,c,1,1]
    s = b.conv(f"{p}/se/fc1", s, c, c // 4, k=1)
    s = b.op("Relu", f"{p}/se/relu", [s])
    s = b.conv(f"{p}/se/fc2", s, c // 4, c, k=1)
    s = b.op("Sigmoid", f"{p}/se/sigmoid", [s])
    h = b.op("Mul", f"{p}/se/scale", [h, s])  # [1,c,h,w] * [1,c,1,1]
    h = b.op("Add", f"{p}/add", [x, h])
    return b.op("Relu", f"{p}/relu2", [h])


def static_batch_broadcast() -> Sample:
    b = Builder(seed=505)
    c, k = 16, 4
    x = b.conv("stem", "image", 3, c, k=3)
    x = b.op("Relu", "stem/relu", [x])
    for i in range(2):
        x = _se_block(b, f"block{i}", x, c)
    d = b.conv("density/conv", x, c, k, k=1)
    d = b.op("Relu", "density/relu", [d])  # [1,k,32,32]
    s = b.op("GlobalAveragePool", "density/stats/pool", [x])  # [1,c,1,1] per-channel mean
    # per-class level predicted from the channel statistics; its bias (~100) dominates
    w = b.weight("density/stats/proj.weight", (k, c, 1, 1), c)
    lvl = (100.0 + 10.0 * b.rng.standard_normal(k)).astype(np.float32)
    s = b.op("Conv", "density/stats/proj", [s, w, b.init("density/stats/proj.bias", lvl)],
             kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], group=1)  # [1,k,1,1]
    dm = b.op("Add", "density/broadcast_add", [d, s])  # implicit broadcast over H, W
    # counts head: total mass per class, ~1e5 > 65504
    total = b.op("ReduceSum", "count/reduce_sum", [dm, b.const([2, 3], np.int64)], keepdims=0)
    t = b.op("Mul", "count/per_pixel", [total, b.const(1.0 / (32 * 32))])
    t = b.op("Gemm", "count/fc1/gemm", [t, b.weight("count/fc1.weight", (16, k), 100 * k),
                                        b.bias("count/fc1.bias", 16)], transB=1)
    t = b.op("Relu", "count/fc1/relu", [t])
    t = b.op("Gemm", "count/fc2/gemm", [t, b.weight("count/fc2.weight", (k, 16), 16),
                                        b.bias("count/fc2.bias", k)], transB=1)
    b.nodes[-1].output[0] = "counts"
    # density head: normalise, refine with two more SE blocks, back to k maps
    r = b.op("Mul", "refine/normalize", [dm, b.const(0.01)])
    r = b.conv("refine/in", r, k, c, k=3)
    r = b.op("Relu", "refine/in_relu", [r])
    for i in range(2):
        r = _se_block(b, f"refine/block{i}", r, c)
    r = b.conv("refine/out", r, c, k, k=1)
    b.op("Softplus", "refine/out_softplus", [r])
    b.nodes[-1].output[0] = "density"
    model = b.build("static_batch_broadcast", [("image", [1, 3, 32, 32])],
                    ["density", "counts"], "density/count network (reprokit sample)")
    fault = "count/reduce_sum"
    return Sample(
        name="static_batch_broadcast",
        model=model,
        description=(
            "Crowd-counting-like density network with static batch 1: stem and two "
            "squeeze-excitation residual blocks ([1,C,1,1] gates broadcast onto [1,C,H,W]); a "
            "per-class level predicted from per-channel statistics ([1,4,1,1], ~100) is "
            "broadcast-added onto the [1,4,32,32] coarse density map. Two outputs: 'density' "
            "(the broadcast result refined by two more SE blocks; fine in fp16) and 'counts', "
            "whose ReduceSum over the broadcast result is ~1e5 > 65504: inf in fp16, then "
            "inf/NaN through the count MLP."),
        mimics=("tinygrad/tinygrad#11705 (ReduceSum 70091 overflows to inf in fp16 on an ONNX "
                "model); pytorch/pytorch#2391 (fp16 reductions overflow)"),
        fault_node=fault,
        fault_op="ReduceSum",
        keep_fp32=[fault, "count/per_pixel"],  # the sum and the op that brings it back in range
    )


# --------------------------------------------------------------------------------------------
# measured verdicts (samples/measure.py recomputes them; see samples/README.md)
# --------------------------------------------------------------------------------------------

MEASURED: dict[str, dict[str, tuple]] = {
    "attention_softmax_nan": {
        "emulate:fp16": ("nonfinite", {"log_scores": (3072, 0, None)}),
        "emulate:bf16": ("mismatch", {"log_scores": (0, 0, 0.131)}),
        "openvino:bf16": ("agree", {"log_scores": (0, 0, 0.00529)}),
        "emulate:fp16+keep_fp32": ("agree", {"log_scores": (0, 0, 0.000743)}),
    },
    "layernorm_overflow": {
        "emulate:fp16": ("mismatch", {"restored": (0, 0, 0.367)}),
        "emulate:bf16": ("agree", {"restored": (0, 0, 0.0119)}),
        "openvino:bf16": ("agree", {"restored": (0, 0, 0.013)}),
        "emulate:fp16+keep_fp32": ("agree", {"restored": (0, 0, 0.00137)}),
    },
    "log_div_underflow": {
        "emulate:fp16": ("nonfinite", {"enhanced": (3072, 0, None)}),
        "emulate:bf16": ("agree", {"enhanced": (0, 0, 0.0105)}),
        "openvino:bf16": ("agree", {"enhanced": (0, 0, 0.0111)}),
        "emulate:fp16+keep_fp32": ("agree", {"enhanced": (0, 0, 0.000515)}),
    },
    "conv_clip": {
        "emulate:fp16": ("mismatch", {"output": (0, 0, 0.378)}),
        "emulate:bf16": ("mismatch", {"output": (0, 0, 0.378)}),
        "openvino:bf16": ("agree", {"output": (0, 0, 0.00559)}),
        "emulate:fp16+keep_fp32": ("agree", {"output": (0, 0, 0.00104)}),
    },
    "static_batch_broadcast": {
        "emulate:fp16": ("nonfinite", {"density": (0, 0, 0.000357), "counts": (4, 0, None)}),
        "emulate:bf16": ("agree", {"density": (0, 0, 0.00295), "counts": (0, 0, 0.00345)}),
        "openvino:bf16": ("agree", {"density": (0, 0, 0.00216), "counts": (0, 0, 0.00467)}),
        "emulate:fp16+keep_fp32": ("agree", {"density": (0, 0, 0.000357), "counts": (0, 0, 0.00025)}),
    },
}


MEASURED_WITH = (
    "samples/measure.py with feeds <name>.inputs.npz; reference onnxruntime 1.31.1 CPU fp32 "
    "(graph optimizations off); emulate = reprokit.engine.backends.emulate.emulate_model (fp16/bf16 "
    "storage, fp32 arithmetic); OpenVINO 2026.4.1 CPU INFERENCE_PRECISION_HINT=bf16 on an AMD "
    "EPYC with AVX512-BF16; emulate:fp16+keep_fp32 leaves the sample's keep_fp32 nodes in fp32. "
    "Verdicts: nonfinite = NaN/Inf where the reference is finite; mismatch = rel L2 "
    "||t-r||/||r|| > 1e-2 (fp16) or > 5e-2 (bf16); agree otherwise. rel_l2 is null when the "
    "output is not finite."
)

# the verdict names the catalog's "expected" block carries (keep_fp32 is a what-if, not a target)
EXPECTED_TARGETS = ("emulate:fp16", "emulate:bf16", "openvino:bf16")

BUILDERS: list[Callable[[], Sample]] = [
    attention_softmax_nan,
    layernorm_overflow,
    log_div_underflow,
    conv_clip,
    static_batch_broadcast,
]


def build_samples() -> list[Sample]:
    samples = [make() for make in BUILDERS]
    for sample in samples:
        sample.expected = {t: MEASURED[sample.name][t][0] for t in EXPECTED_TARGETS}
    return samples


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def graph_inputs(model: onnx.ModelProto) -> list[tuple[str, tuple[int, ...]]]:
    inits = {i.name for i in model.graph.initializer}
    return [(vi.name, tuple(d.dim_value for d in vi.type.tensor_type.shape.dim))
            for vi in model.graph.input if vi.name not in inits]


def random_feeds(model: onnx.ModelProto, seed: int = FEED_SEED) -> dict[str, np.ndarray]:
    """Feeds as reprokit draws them by default: one generator, inputs in graph order."""
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(0, 1, size=shape).astype(np.float32)
            for name, shape in graph_inputs(model)}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz (np.load-able) with fixed timestamps, unlike np.savez: byte-identical reruns."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            data = io.BytesIO()
            np.lib.format.write_array(data, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, data.getvalue())
    return buffer.getvalue()


def catalog_entry(sample: Sample) -> dict:
    return {
        "name": sample.name,
        "file": f"{sample.name}.onnx",
        "inputs": f"{sample.name}.inputs.npz",
        "description": sample.description,
        "mimics": sample.mimics,
        "nodes": len(sample.model.graph.node),
        "fault_node": sample.fault_node,
        "fault_op": sample.fault_op,
        "keep_fp32": list(sample.keep_fp32),
        "input_shapes": {n: list(s) for n, s in graph_inputs(sample.model)},
        "outputs": [o.name for o in sample.model.graph.output],
        "expected": dict(sample.expected),
        "measured": {
            target: {"verdict": verdict,
                     "outputs": {name: {"nan": nan, "inf": inf, "rel_l2": rel}
                                 for name, (nan, inf, rel) in outputs.items()}}
            for target, (verdict, outputs) in MEASURED[sample.name].items()
        },
    }


def generate(out_dir: str | Path) -> list[Path]:
    """Build every sample and write it under ``out_dir``; returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    entries = []
    for sample in build_samples():
        onnx.checker.check_model(sample.model, full_check=True)
        names = {n.name for n in sample.model.graph.node}
        missing = [n for n in sample.keep_fp32 if n not in names]
        if missing or sample.fault_node not in names:
            raise RuntimeError(f"{sample.name}: unknown node names {missing or sample.fault_node}")
        path = out / f"{sample.name}.onnx"
        path.write_bytes(sample.model.SerializeToString())
        feeds_path = out / f"{sample.name}.inputs.npz"
        feeds_path.write_bytes(npz_bytes(random_feeds(sample.model)))
        written += [path, feeds_path]
        entries.append(catalog_entry(sample))
    catalog = out / "catalog.json"
    catalog.write_text(json.dumps({"measured_with": MEASURED_WITH, "samples": entries}, indent=2)
                       + "\n", encoding="utf-8")
    written.append(catalog)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE), help="output folder (default: samples/)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
