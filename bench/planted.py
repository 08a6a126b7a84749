"""Planted cases for the reduction benchmark (bench/bench_calls.py): models with a known fault, their
feeds, and pass/fail check scripts. Generated here, deterministic, nothing downloaded.

Numeric (emulate:fp16 against ORT fp32):
  blocks      three transformer blocks (decomposed LayerNorm, attention with Softmax, MLP); the
              middle block's attention logits overflow fp16                    → nonfinite
  l2norm      x·x → ReduceSum → Sqrt → Div(x, ·) between other layers: the square overflows, the
              fault needs four nodes                                            → mismatch
  two_faults  two outputs, an Exp overflow on one and an L2 normalization on the other → nonfinite
  chain2000   a 2,000-node residual chain; one Mul(1e5)→Div(1e5) pair overflows in between
Pass/fail (cmd checks, exit status only):
  conv_clip fusion   a Conv→Clip pair fails "to build" only when the Conv output is internal
  polygraphy's reducable scenarios (fails when all given node names are present)
  a TensorRT-parser-like message naming a Unique node in a 120-node model
  OpenVINO refusing a Det node inside a 120-node model (a real engine, openvino:f32)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
OPSET = 17


def _model(nodes, inputs, outputs, inits, opset=OPSET):
    graph = helper.make_graph(nodes, "planted", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class _Builder:
    """Named nodes and initializers, in order."""

    def __init__(self, seed: int = 0):
        self.nodes, self.inits = [], []
        self.rng = np.random.default_rng(seed)

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def op(self, op, inputs, name, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def layernorm(self, x, p):  # ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, Mul, Add
        mean = self.op("ReduceMean", [x], f"{p}/mean", axes=[-1])
        centered = self.op("Sub", [x, mean], f"{p}/sub")
        square = self.op("Mul", [centered, centered], f"{p}/sq")
        var = self.op("ReduceMean", [square], f"{p}/var", axes=[-1])
        eps = self.op("Add", [var, self.const(f"{p}/eps", 1e-5)], f"{p}/add_eps")
        std = self.op("Sqrt", [eps], f"{p}/sqrt")
        norm = self.op("Div", [centered, std], f"{p}/div")
        return self.op("Add", [self.op("Mul", [norm, self.const(f"{p}/g", 1.0)], f"{p}/scale"),
                               self.const(f"{p}/b", 0.0)], f"{p}/shift")

    def linear(self, x, p, n_in, n_out, gain=1.0):
        w = self.const(f"{p}/w", self.rng.standard_normal((n_in, n_out)) * gain / np.sqrt(n_in))
        return self.op("Add", [self.op("MatMul", [x, w], f"{p}/matmul"), self.const(f"{p}/bias", np.zeros(n_out))],
                       f"{p}/add")


def blocks():
    """x[1,16,32] → 3 × (LayerNorm → Q,K,V → QK^T·s → Softmax → ·V → out proj → +x → LN → MLP → +)."""
    b = _Builder(1)
    x = "x"
    for k in range(3):
        p = f"block{k}"
        h = b.layernorm(x, f"{p}/ln1")
        q = b.linear(h, f"{p}/q", 32, 32, gain=60.0 if k == 1 else 1.0)  # block1: logits ~1e5
        key = b.linear(h, f"{p}/k", 32, 32, gain=60.0 if k == 1 else 1.0)
        v = b.linear(h, f"{p}/v", 32, 32)
        kt = b.op("Transpose", [key], f"{p}/kt", perm=[0, 2, 1])
        logits = b.op("MatMul", [q, kt], f"{p}/qk")
        probs = b.op("Softmax", [b.op("Mul", [logits, b.const(f"{p}/scale", 1 / np.sqrt(32))], f"{p}/scaled")],
                     f"{p}/softmax", axis=-1)
        att = b.linear(b.op("MatMul", [probs, v], f"{p}/pv"), f"{p}/o", 32, 32)
        x1 = b.op("Add", [x, att], f"{p}/res1")
        m = b.op("Relu", [b.linear(b.layernorm(x1, f"{p}/ln2"), f"{p}/fc1", 32, 64)], f"{p}/relu")
        x = b.op("Add", [x1, b.linear(m, f"{p}/fc2", 64, 32)], f"{p}/res2")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [1, 16, 32])],
                   [helper.make_tensor_value_info(x, F, [1, 16, 32])], b.inits)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)}
    return model, feeds


def _l2norm(b, x, p):
    square = b.op("Mul", [x, x], f"{p}/square")
    total = b.op("ReduceSum", [square, b.int64(f"{p}/axes", [-1])], f"{p}/sum")
    return b.op("Div", [x, b.op("Sqrt", [total], f"{p}/sqrt")], f"{p}/div")


def _with_int64(builder):
    def int64(name, value):
        builder.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
        return name
    builder.int64 = int64
    return builder


def l2norm():
    """x[4,64] → MLP (3 layers) → ×400 → L2-normalize (Mul, ReduceSum, Sqrt, Div) → MLP (3)."""
    b = _with_int64(_Builder(2))
    h = "x"
    for k in range(3):
        h = b.op("Tanh", [b.linear(h, f"pre{k}", 64, 64)], f"pre{k}/tanh")
    big = b.op("Mul", [h, b.const("gain", 400.0)], "gain_mul")  # |big| ~ 300: big² past 65504
    h = _l2norm(b, big, "l2")
    for k in range(3):
        h = b.op("Tanh", [b.linear(h, f"post{k}", 64, 64, gain=8.0)], f"post{k}/tanh")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [4, 64])],
                   [helper.make_tensor_value_info(h, F, [4, 64])], b.inits)
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    return model, feeds


def two_faults():
    """x[4,64] → trunk (2 layers) → head a: Exp(·12) → out_a (overflows: inf)
                                   → head b: ×400 → L2-normalize → out_b (mismatch)."""
    b = _with_int64(_Builder(3))
    h = "x"
    for k in range(2):
        h = b.op("Tanh", [b.linear(h, f"trunk{k}", 64, 64)], f"trunk{k}/tanh")
    a = b.op("Exp", [b.op("Mul", [h, b.const("a/gain", 12.0)], "a/mul")], "a/exp")
    out_a = b.op("ReduceSum", [a, b.int64("a/axes", [-1])], "a/sum")
    out_b = _l2norm(b, b.op("Mul", [h, b.const("b/gain", 400.0)], "b/mul"), "b/l2")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [4, 64])],
                   [helper.make_tensor_value_info(out_a, F, [4, 1]), helper.make_tensor_value_info(out_b, F, [4, 64])],
                   b.inits)
    feeds = {"x": np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)}
    return model, feeds


def chain(n_nodes: int = 2000, fault_at: float = 0.6):
    """x[1,16] → residual blocks (MatMul, Add, Tanh, Mul 0.5, Add residual) …; at ``fault_at`` of the
    way one block is Mul(1e5) → Div(1e5): an fp32 no-op whose intermediate overflows fp16."""
    b = _Builder(4)
    h = "x"
    blocks = (n_nodes - 2) // 5
    fault = int(blocks * fault_at)
    for k in range(blocks):
        t = b.op("Tanh", [b.linear(h, f"b{k}", 16, 16)], f"b{k}/tanh")
        t = b.op("Mul", [t, b.const(f"b{k}/half_c", 0.5)], f"b{k}/half")
        h = b.op("Add", [h, t], f"b{k}/res")
        if k == fault:
            up = b.op("Mul", [h, b.const("fault/up_c", 1e5)], "fault/up")
            h = b.op("Div", [up, b.const("fault/down_c", 1e5)], "fault/down")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [1, 16])],
                   [helper.make_tensor_value_info(h, F, [1, 16])], b.inits)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)}
    return model, feeds


def with_named_op(op: str = "Unique", n_nodes: int = 120):
    """x[2,8] → a chain of ``n_nodes`` cheap ops with one ``op`` node ("suspect") in the middle."""
    b = _Builder(5)
    h = "x"
    for k in range(n_nodes - 1):
        if k == n_nodes // 2:
            h = b.op(op, [h], "suspect")
            continue
        h = b.op(["Relu", "Sigmoid", "Abs", "Neg"][k % 4], [h], f"n{k}")
    h = b.op("Identity", [h], "last")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [2, 8] if op != "Det" else [8, 8])],
                   [helper.make_tensor_value_info(h, F, [] if op == "Det" else ["n"])], b.inits)
    shape = (8, 8) if op == "Det" else (2, 8)
    feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
    return model, feeds


def cnn_with_one_clip(blocks: int = 64, clip_at: int = 41):
    """x[1,4,8,8] → ``blocks`` × (Conv 3x3 → Relu), 144 nodes, but block ``clip_at`` is Conv → Clip(0, 6)
    ("fused/conv", "fused/clip"); every fourth block also adds a residual (its Conv output has two
    readers there: no fusion). A fusion case unseen by the reduction code's tests (issue 25)."""
    b = _Builder(7)
    h = "x"
    for k in range(blocks):
        name = "fused" if k == clip_at else f"b{k}"
        w = b.const(f"{name}/w", b.rng.standard_normal((4, 4, 3, 3)) * 0.3)
        conv = b.op("Conv", [h, w], f"{name}/conv", pads=[1, 1, 1, 1])
        if k == clip_at:
            h = b.op("Clip", [conv, b.const("lo", 0.0), b.const("hi", 6.0)], f"{name}/clip")
        elif k % 4 == 3:
            h = b.op("Add", [b.op("Relu", [conv], f"{name}/relu"), conv], f"{name}/res")
        else:
            h = b.op("Relu", [conv], f"{name}/relu")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                   [helper.make_tensor_value_info(h, F, [1, 4, 8, 8])], b.inits)
    return model, {"x": np.random.default_rng(8).standard_normal((1, 4, 8, 8)).astype(np.float32)}


# -- polygraphy's reducable models, rebuilt from their description ------------------------------

def reducable():
    """X0 → Identity(node_1) ─┐                    ┌→ Identity(node_7) → Z1
                              Add(node_5) → Z0 ──┤
       Y0 → Identity(node_3) ─┘                    └→ Identity(node_9) → Z2"""
    n = lambda i: f"onnx_graphsurgeon_node_{i}"  # noqa: E731
    nodes = [helper.make_node("Identity", ["X0"], ["X1"], name=n(1)),
             helper.make_node("Identity", ["Y0"], ["Y1"], name=n(3)),
             helper.make_node("Add", ["X1", "Y1"], ["Z0"], name=n(5)),
             helper.make_node("Identity", ["Z0"], ["Z1"], name=n(7)),
             helper.make_node("Identity", ["Z0"], ["Z2"], name=n(9))]
    model = _model(nodes, [helper.make_tensor_value_info("X0", F, [1]), helper.make_tensor_value_info("Y0", F, [1])],
                   [helper.make_tensor_value_info("Z1", F, [1]), helper.make_tensor_value_info("Z2", F, [1])], [])
    return model, {"X0": np.array([1.0], np.float32), "Y0": np.array([2.0], np.float32)}


def reducable_with_const():
    """Constant(node_1) → Identity(node_3) → Identity(node_5) → output; no graph inputs."""
    n = lambda i: f"onnx_graphsurgeon_node_{i}"  # noqa: E731
    nodes = [helper.make_node("Constant", [], ["X0"], name=n(1),
                              value=numpy_helper.from_array(np.ones((4, 4), np.float32), "const")),
             helper.make_node("Identity", ["X0"], ["X1"], name=n(3)),
             helper.make_node("Identity", ["X1"], ["X2"], name=n(5))]
    return _model(nodes, [], [helper.make_tensor_value_info("X2", F, [4, 4])], []), {}


def multi_output():
    """X → Identity(node_1) → Split(node_3) → A, B (two outputs)."""
    n = lambda i: f"onnx_graphsurgeon_node_{i}"  # noqa: E731
    split = helper.make_tensor("split", TensorProto.INT64, [2], [2, 2])
    nodes = [helper.make_node("Identity", ["X"], ["X1"], name=n(1)),
             helper.make_node("Split", ["X1", "split"], ["A", "B"], name=n(3), axis=0)]
    model = _model(nodes, [helper.make_tensor_value_info("X", F, [4, 2])],
                   [helper.make_tensor_value_info("A", F, [2, 2]), helper.make_tensor_value_info("B", F, [2, 2])],
                   [split])
    return model, {"X": np.arange(8, dtype=np.float32).reshape(4, 2)}


# -- check scripts (pass/fail: the exit status is the verdict) ----------------------------------

FAKE_REDUCE_CHECKER = '''\
"""Fails (exit 1) when every --fail-node name is in the model; says which, like polygraphy's
tests/tools/fake_reduce_checker.py does (written from its description)."""
import argparse, sys
import onnx
parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--fail-node", nargs="+", default=[])
parser.add_argument("--default-return-code", type=int, default=1)
args = parser.parse_args()
names = {n.name for n in onnx.load(args.model).graph.node}
if all(name in names for name in args.fail_node):
    print("REALLY BAD!" if "onnx_graphsurgeon_node_1" in names else "FOUND A BAD NODE!")
    sys.exit(args.default_return_code)
'''

FUSION_CHECKER = '''\
"""A "builder" whose Conv+Clip fusion is broken: it fails when a Conv's output is read by exactly
one Clip and is not a graph output (marking the tensor prevents the fusion)."""
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
outputs = {o.name for o in graph.output}
readers = {}
for node in graph.node:
    for name in node.input:
        readers.setdefault(name, []).append(node)
for node in graph.node:
    if node.op_type == "Conv" and node.output[0] not in outputs:
        using = readers.get(node.output[0], [])
        if len(using) == 1 and using[0].op_type == "Clip":
            print(f"[E] [TRT] fusing {node.name} + {using[0].name}: Assertion failed: tactic != nullptr")
            sys.exit(1)
'''

# The same fusion failure, but the check says nothing about where (exit status only).
SILENT_FUSION_CHECKER = FUSION_CHECKER.replace(
    'print(f"[E] [TRT] fusing {node.name} + {using[0].name}: Assertion failed: tactic != nullptr")',
    'print("[E] [TRT] engine build failed")')

PARSER_CHECKER = '''\
"""Prints what TensorRT's ONNX parser says about an op it cannot import, and fails."""
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
for index, node in enumerate(graph.node):
    if node.op_type == "Unique":
        print(f"[E] [TRT] ModelImporter.cpp:949: While parsing node number {index} [Unique -> \\"{node.output[0]}\\"]:")
        print(f"[E] [TRT] In node {index} with name: {node.name} and operator: Unique (parseNode): UNSUPPORTED_NODE: "
              "No importer registered for op: Unique")
        sys.exit(1)
'''


def write_checker(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def save(model, feeds, directory: str, name: str) -> tuple[str, str]:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.onnx")
    onnx.save(model, path)
    inputs = os.path.join(directory, f"{name}.inputs.npz")
    np.savez(inputs, **feeds)
    return path, inputs


if __name__ == "__main__":  # python bench/planted.py DIR: write every model and feed
    out = sys.argv[1] if len(sys.argv) > 1 else "planted"
    for name, make in [("blocks", blocks), ("l2norm", l2norm), ("two_faults", two_faults), ("chain2000", chain),
                       ("unique120", with_named_op), ("det120", lambda: with_named_op("Det")),
                       ("reducable", reducable), ("reducable_with_const", reducable_with_const),
                       ("multi_output", multi_output)]:
        print(*save(*make(), out, name))
