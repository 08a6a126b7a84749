"""Generate a transformer-like ONNX model with external-data weights and a planted fp16 fault.

    python bench/make_big_model.py OUT_DIR [--layers 16 --hidden 2048 --heads 16 --seq 16]

Diagram per layer: x → LayerNorm (decomposed) → per-head [Slice Q/K/V → MatMul QKᵀ → Mul scale
→ Softmax → MatMul V] → Concat → MatMul O → Add residual → LayerNorm → MatMul FF1 → Gelu (Erf,
decomposed) → MatMul FF2 → Add residual. In layer ``--fault-layer`` one head's query weights are
scaled so its logits pass fp16's 65504: Softmax gives NaN under fp16 storage.
Weights are written once to ``OUT_DIR/weights.bin`` (external data), the graph to
``OUT_DIR/model.onnx``; 16 layers at hidden 2048 hold ~3.2 GB of weights and ~3,000 nodes.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Writer:
    """Appends weights to one external data file as they are made: memory stays one tensor."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, "weights.bin")
        self.handle = open(self.path, "wb")
        self.offset = 0
        self.initializers = []

    def add(self, name: str, array: np.ndarray):
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        tensor = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "weights.bin"), ("offset", str(self.offset)), ("length", str(len(data)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.handle.write(data)
        self.offset += len(data)
        self.initializers.append(tensor)
        return name

    def small(self, name: str, array):
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def close(self):
        self.handle.close()


def build(folder: str, layers: int, hidden: int, heads: int, seq: int, fault_layer: int, seed: int = 0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = Writer(folder)
    nodes = []
    head = hidden // heads

    def op(kind, inputs, name, **attrs):
        out = f"{name}_out"
        nodes.append(helper.make_node(kind, inputs, [out], name=name, **attrs))
        return out

    def weight(name, shape, scale):
        return w.add(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    eps = w.small("eps", np.array(1e-5, np.float32))
    two = w.small("two", np.array(2.0, np.float32))
    half = w.small("half", np.array(0.5, np.float32))
    one = w.small("one", np.array(1.0, np.float32))
    sqrt2 = w.small("inv_sqrt2", np.array(1 / np.sqrt(2), np.float32))
    scale = w.small("attn_scale", np.array(1 / np.sqrt(head), np.float32))
    axes = w.small("last_axis", np.array([-1], np.int64))

    def layernorm(x, p):
        mean = op("ReduceMean", [x], f"{p}/mean", axes=[-1])
        centered = op("Sub", [x, mean], f"{p}/sub")
        square = op("Pow", [centered, two], f"{p}/pow")
        var = op("ReduceMean", [square], f"{p}/var", axes=[-1])
        stable = op("Add", [var, eps], f"{p}/add_eps")
        std = op("Sqrt", [stable], f"{p}/sqrt")
        normed = op("Div", [centered, std], f"{p}/div")
        gamma = w.small(f"{p}/gamma", np.ones(hidden, np.float32))
        beta = w.small(f"{p}/beta", np.zeros(hidden, np.float32))
        return op("Add", [op("Mul", [normed, gamma], f"{p}/mul"), beta], f"{p}/shift")

    x = "x"
    for layer in range(layers):
        p = f"layer{layer}"
        h = layernorm(x, f"{p}/ln1")
        qkv_w = (rng.standard_normal((hidden, 3 * hidden)) * (1 / np.sqrt(hidden))).astype(np.float32)
        if layer == fault_layer:
            qkv_w[:, :head] *= 400.0  # head 0's queries: logits far past 65504
            qkv_w[:, hidden:hidden + head] *= 400.0  # and its keys
        qkv = op("MatMul", [h, w.add(f"{p}/attn/qkv_w", qkv_w)], f"{p}/attn/qkv")
        outs = []
        for k in range(heads):
            hp = f"{p}/attn/head{k}"
            starts = [w.small(f"{hp}/{part}_start", np.array([i * hidden + k * head], np.int64)) for i, part in enumerate("qkv")]
            ends = [w.small(f"{hp}/{part}_end", np.array([i * hidden + (k + 1) * head], np.int64)) for i, part in enumerate("qkv")]
            q, kk, v = (op("Slice", [qkv, s, e, axes], f"{hp}/slice_{part}") for s, e, part in zip(starts, ends, "qkv"))
            kt = op("Transpose", [kk], f"{hp}/k_t", perm=[0, 2, 1])
            logits = op("MatMul", [q, kt], f"{hp}/qk")
            scaled = op("Mul", [logits, scale], f"{hp}/scale")
            probs = op("Softmax", [scaled], f"{hp}/softmax", axis=-1)
            outs.append(op("MatMul", [probs, v], f"{hp}/av"))
        merged = op("Concat", outs, f"{p}/attn/concat", axis=-1)
        proj = op("MatMul", [merged, weight(f"{p}/attn/o_w", (hidden, hidden), 1 / np.sqrt(hidden))], f"{p}/attn/o")
        x = op("Add", [x, proj], f"{p}/attn/residual")
        h = layernorm(x, f"{p}/ln2")
        ff = op("MatMul", [h, weight(f"{p}/ff1_w", (hidden, 4 * hidden), 1 / np.sqrt(hidden))], f"{p}/ff1")
        erf = op("Erf", [op("Mul", [ff, sqrt2], f"{p}/gelu/div")], f"{p}/gelu/erf")
        gelu = op("Mul", [op("Mul", [ff, op("Add", [erf, one], f"{p}/gelu/add")], f"{p}/gelu/mul"), half], f"{p}/gelu/half")
        down = op("MatMul", [gelu, weight(f"{p}/ff2_w", (4 * hidden, hidden), 1 / np.sqrt(4 * hidden))], f"{p}/ff2")
        x = op("Add", [x, down], f"{p}/ff/residual")
    w.close()
    graph = helper.make_graph(nodes, "big_transformer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, hidden])], w.initializers)
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, os.path.join(folder, "model.onnx"))
    return os.path.join(folder, "model.onnx"), len(nodes), w.offset


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--fault-layer", type=int, default=None, help="default: two thirds down")
    args = parser.parse_args(argv)
    fault = args.fault_layer if args.fault_layer is not None else (2 * args.layers) // 3
    path, nodes, size = build(args.out, args.layers, args.hidden, args.heads, args.seq, fault)
    print(f"{path}: {nodes} nodes, {size / 2**30:.2f} GiB of external weights, fault in layer {fault}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
