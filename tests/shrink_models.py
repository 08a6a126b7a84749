"""Tiny ONNX model generators and check scripts for the shrink, subgraph and reducer tests.

Every generator returns an ``onnx.ModelProto`` (IR 8, opset 17: onnxruntime here reads IR <= 13)
and carries a one-line diagram of its graph. Node names never contain op type names, so a check
script may look for an op by searching the model's bytes for its op type.
"""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
PY = sys.executable


def make(nodes, inputs, outputs, initializers=(), name="g") -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(
        graph,
        ir_version=8,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="shrink-tests",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model: onnx.ModelProto, path) -> str:
    path = os.fspath(path)
    onnx.save(model, path)
    return path


def const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def vi(name: str, shape, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def node(op, inputs, outputs, name, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


def uniform_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """uniform [0, 1) float32 feeds for every graph input, in graph order."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in init:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.uniform(0, 1, shape).astype(np.float32)
    return feeds


# -- models -----------------------------------------------------------------------------------


def agreeing_mlp() -> onnx.ModelProto:
    """Small values everywhere: fp16 storage changes nothing beyond the fp16 tolerance."""
    # x[1,8] -> MatMul(W) -> h -> Add(b) -> a -> Relu -> y[1,4]
    rng = np.random.default_rng(3)
    return make(
        [
            node("MatMul", ["x", "W"], ["h"], "mm"),
            node("Add", ["h", "b"], ["a"], "bias"),
            node("Relu", ["a"], ["y"], "act"),
        ],
        [vi("x", [1, 8])],
        [vi("y", [1, 4])],
        [const("W", rng.uniform(-0.5, 0.5, (8, 4))), const("b", rng.uniform(0.1, 0.2, (4,)))],
    )


def branch_fault() -> onnx.ModelProto:
    """Two branches from one input; only branch b overflows fp16 (its MatMul reaches ~1.2e5).
    Node list interleaves the branches so no contiguous window holds only one of them."""
    # x[1,16] -+-> a/mm(Wa) -> a/relu -> a/bias -> a/tanh -> ya[1,4]
    #          +-> b/scale -> b/mm(Wb = 1e4: ~1.2e5, inf in fp16) -> b/softmax (NaN) -> b/out -> yb[1,4]
    rng = np.random.default_rng(4)
    nodes = [
        node("MatMul", ["x", "Wa"], ["a1"], "a/mm"),
        node("Mul", ["x", "two"], ["b1"], "b/scale"),
        node("Relu", ["a1"], ["a2"], "a/relu"),
        node("MatMul", ["b1", "Wb"], ["b2"], "b/mm"),
        node("Add", ["a2", "ba"], ["a3"], "a/bias"),
        node("Softmax", ["b2"], ["b3"], "b/softmax", axis=-1),
        node("Tanh", ["a3"], ["ya"], "a/tanh"),
        node("Mul", ["b3", "two"], ["yb"], "b/out"),
    ]
    return make(
        nodes,
        [vi("x", [1, 16])],
        [vi("ya", [1, 4]), vi("yb", [1, 4])],
        [
            const("Wa", rng.uniform(-0.3, 0.3, (16, 4))),
            const("ba", [0.1, 0.2, 0.3, 0.4]),
            const("two", 2.0),
            const("Wb", np.full((16, 4), 1e4)),
        ],
    )


def two_outputs_one_diverges() -> onnx.ModelProto:
    """A shared trunk feeds two outputs; only 'total' (a ReduceSum of ~2.4e5) overflows fp16."""
    # x[1,4,64,64] -> t/scale(x30) -> t/relu -+-> d/sig -> d/half -> density (agrees)
    #                                         +-> c/sum (~2.4e5: inf in fp16) -> c/scale -> total
    nodes = [
        node("Mul", ["x", "thirty"], ["t1"], "t/scale"),
        node("Relu", ["t1"], ["t2"], "t/relu"),
        node("Sigmoid", ["t2"], ["d1"], "d/sig"),
        node("ReduceSum", ["t2", "axes"], ["c1"], "c/sum", keepdims=1),
        node("Mul", ["d1", "half"], ["density"], "d/half"),
        node("Mul", ["c1", "milli"], ["total"], "c/scale"),
    ]
    return make(
        nodes,
        [vi("x", [1, 4, 64, 64])],
        [vi("density", [1, 4, 64, 64]), vi("total", [1, 1, 1, 1])],
        [
            const("thirty", 30.0),
            const("half", 0.5),
            const("milli", 1e-3),
            const("axes", [1, 2, 3], np.int64),
        ],
    )


UNARY_FILLERS = ("Neg", "Abs", "Softsign", "Relu")


def pair_chain(length: int = 32, first: int = 4, second: int = 27) -> onnx.ModelProto:
    """A chain of cheap unary ops with one Sigmoid (at ``first``) and one Tanh (at ``second``)."""
    # x[1,8] -> n00 -> ... -> n04 Sigmoid -> ... -> n27 Tanh -> ... -> n31 -> y[1,8]
    nodes = []
    for i in range(length):
        op = (
            "Sigmoid"
            if i == first
            else "Tanh"
            if i == second
            else UNARY_FILLERS[i % len(UNARY_FILLERS)]
        )
        src = "x" if i == 0 else f"t{i - 1:02d}"
        dst = "y" if i == length - 1 else f"t{i:02d}"
        nodes.append(node(op, [src], [dst], f"n{i:02d}"))
    return make(nodes, [vi("x", [1, 8])], [vi("y", [1, 8])])


def conv_relu_fusion() -> onnx.ModelProto:
    """A chain with one Conv whose output only a Relu reads (fusable) and one Conv that is not."""
    # x[1,3,8,8] -> pre/sig -> pre/scale -> f/conv -> f/relu -> post/mul -> g/conv -> post/add -> post/tanh -> y
    rng = np.random.default_rng(5)
    nodes = [
        node("Sigmoid", ["x"], ["s0"], "pre/sig"),
        node("Mul", ["s0", "k"], ["s1"], "pre/scale"),
        node("Conv", ["s1", "W1", "B1"], ["c1"], "f/conv", pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], ["r1"], "f/relu"),
        node("Mul", ["r1", "k"], ["m1"], "post/mul"),
        node("Conv", ["m1", "W2", "B2"], ["c2"], "g/conv", pads=[1, 1, 1, 1]),
        node("Add", ["c2", "k"], ["a2"], "post/add"),
        node("Tanh", ["a2"], ["y"], "post/tanh"),
    ]
    return make(
        nodes,
        [vi("x", [1, 3, 8, 8])],
        [vi("y", [1, 4, 8, 8])],
        [
            const("k", 0.5),
            const("W1", rng.uniform(0.0, 0.2, (4, 3, 3, 3))),
            const("B1", np.full((4,), 0.5)),
            const("W2", rng.uniform(-0.1, 0.1, (4, 4, 3, 3))),
            const("B2", np.zeros(4)),
        ],
    )


def clip_empty_min_fault() -> onnx.ModelProto:
    """Clip with an empty optional min input, and the overflow in the node right after it."""
    # x[1,16] -> pre/relu -> pre/clip(r, '', 6) -> mm(W = 3e4: ~2.4e5, inf in fp16) -> softmax (NaN) -> out -> y
    nodes = [
        node("Relu", ["x"], ["r"], "pre/relu"),
        node("Clip", ["r", "", "cmax"], ["c"], "pre/clip"),
        node("MatMul", ["c", "W"], ["h"], "mm"),
        node("Softmax", ["h"], ["p"], "softmax", axis=-1),
        node("Mul", ["p", "two"], ["y"], "out"),
    ]
    return make(
        nodes,
        [vi("x", [1, 16])],
        [vi("y", [1, 4])],
        [const("cmax", 6.0), const("W", np.full((16, 4), 3e4)), const("two", 2.0)],
    )


def if_loop_fault() -> onnx.ModelProto:
    """An If whose branches read outer-scope tensors and a Loop whose body does too; the fp16
    overflow is in the MatMul after them."""
    # x[1,8] -> relu -> a -> rsum -> gt -> cond; If(cond: a*k | a-k) -> b;
    # Loop(3: v = v*half + a) -> l -> mm(W = 3e4, inf in fp16) -> softmax (NaN) -> y
    then_g = helper.make_graph(
        [node("Mul", ["a", "k"], ["then_out"], "then/mul")],
        "then_branch",
        [],
        [vi("then_out", [1, 8])],
    )
    else_g = helper.make_graph(
        [node("Sub", ["a", "k"], ["else_out"], "else/sub")],
        "else_branch",
        [],
        [vi("else_out", [1, 8])],
    )
    body = helper.make_graph(
        [
            node("Identity", ["cond_in"], ["cond_out"], "body/cond"),
            node("Mul", ["v_in", "half"], ["v_half"], "body/mul"),
            node("Add", ["v_half", "a"], ["v_out"], "body/add"),
        ],
        "loop_body",
        [
            vi("iter", [], TensorProto.INT64),
            vi("cond_in", [], TensorProto.BOOL),
            vi("v_in", [1, 8]),
        ],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [1, 8])],
    )
    nodes = [
        node("Relu", ["x"], ["a"], "relu"),
        node("ReduceSum", ["a"], ["s"], "rsum", keepdims=0),
        node("Greater", ["s", "zero"], ["cond"], "gt"),
        node("If", ["cond"], ["b"], "branch", then_branch=then_g, else_branch=else_g),
        node("Loop", ["trips", "true", "b"], ["l"], "loop", body=body),
        node("MatMul", ["l", "W"], ["h"], "mm"),
        node("Softmax", ["h"], ["y"], "softmax", axis=-1),
    ]
    return make(
        nodes,
        [vi("x", [1, 8])],
        [vi("y", [1, 4])],
        [
            const("k", 2.0),
            const("zero", 0.0),
            const("half", 0.5),
            const("trips", 3, np.int64),
            const("true", True, np.bool_),
            const("W", np.full((8, 4), 3e4)),
        ],
    )


def random_dag(seed: int, n_nodes: int) -> onnx.ModelProto:
    """A random chain with side branches, ``n_nodes`` nodes, every float tensor [2,8].

    Ops: unary (Relu, Sigmoid, Tanh, Neg, Abs), binary (Add, Mul, Sub) with an earlier tensor,
    MatMul with a weight, a two-output Split + Concat, Shape + Reshape (an int64 tensor that a cut
    turns into a constant) and a Constant. Unconsumed tensors become graph outputs.
    """
    # x[2,8] -> (chain of random ops, each reading the latest tensor or an earlier one) -> outputs
    rng = np.random.default_rng(seed)
    nodes, inits, pool, consumed = [], [], ["x"], set()

    def pick(latest_bias=0.65):
        return pool[-1] if rng.random() < latest_bias else pool[int(rng.integers(len(pool)))]

    def emit(op, inputs, outputs, **attrs):
        nodes.append(node(op, inputs, outputs, f"k{len(nodes):02d}", **attrs))
        consumed.update(inputs)

    while len(nodes) < n_nodes:
        i = len(nodes)
        room = n_nodes - len(nodes)
        choice = int(rng.integers(8))
        out = f"v{i:02d}"
        if choice <= 2:
            emit(["Relu", "Sigmoid", "Tanh", "Neg", "Abs"][int(rng.integers(5))], [pick()], [out])
        elif choice <= 4:
            emit(["Add", "Mul", "Sub"][int(rng.integers(3))], [pick(), pick(0.3)], [out])
        elif choice == 5:
            w = f"w{i:02d}"
            inits.append(const(w, rng.uniform(-0.5, 0.5, (8, 8))))
            emit("MatMul", [pick(), w], [out])
        elif choice == 6 and room >= 2:
            src, lo, hi = pick(), f"{out}_lo", f"{out}_hi"
            emit("Split", [src, "halves"], [lo, hi], axis=1)
            emit("Concat", [hi, lo], [f"v{i + 1:02d}"], axis=1)
            pool.extend([f"v{i + 1:02d}"])
            continue
        elif choice == 7 and room >= 2:
            shape = f"{out}_shape"
            emit("Shape", [pick(0.2)], [shape])
            emit("Reshape", [pick(), shape], [f"v{i + 1:02d}"])
            pool.append(f"v{i + 1:02d}")
            continue
        else:
            value = rng.uniform(-1, 1, (2, 8)).astype(np.float32)
            nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [out],
                    name=f"k{len(nodes):02d}",
                    value=numpy_helper.from_array(value, out + "_value"),
                )
            )
        pool.append(out)
    inits.append(const("halves", [4, 4], np.int64))
    outputs = [t for t in pool[1:] if t not in consumed]
    if pool[-1] not in outputs:
        outputs.append(pool[-1])
    return make(nodes, [vi("x", [2, 8])], [vi(t, [2, 8]) for t in outputs], inits)


# -- onnxruntime, reference style ------------------------------------------------------------


def node_output_names(model: onnx.ModelProto) -> list[str]:
    return [t for n in model.graph.node for t in n.output if t]


def ort_run(
    model: onnx.ModelProto, feeds: dict, names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Run on onnxruntime CPU with graph optimizations off; ``names`` are marked as outputs."""
    import onnxruntime as ort

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    names = list(names) if names is not None else [o.name for o in model.graph.output]
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    existing = {o.name for o in marked.graph.output}
    for name in names:
        if name not in existing:
            marked.graph.output.append(known.get(name) or helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        marked.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return dict(zip(names, session.run(names, feeds)))


# -- check scripts for cmd targets ----------------------------------------------------------

PAIR_SCRIPT = """
    # Fails like a TensorRT build error only when the model holds both a Sigmoid and a Tanh node.
    import sys
    data = open(sys.argv[1], "rb").read()
    print("building engine")
    if b"Sigmoid" in data and b"Tanh" in data:
        print("[E] Error Code 2: unsupported pair (Sigmoid with Tanh)")
        sys.exit(1)
    print("engine built")
"""

SLIPPAGE_SCRIPT = """
    # Message A with both ops; SIGSEGV with Sigmoid alone; a different message B with Tanh alone.
    import os, signal, sys
    data = open(sys.argv[1], "rb").read()
    sig, tanh = b"Sigmoid" in data, b"Tanh" in data
    if sig and tanh:
        print("[E] internal error: myelin fusion of pointwise region failed")
        sys.exit(1)
    if sig:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    if tanh:
        print("[E] error: tactic selection exhausted workspace")
        sys.exit(1)
"""

SLOW_SCRIPT = """
    # Fails at once on the whole chain (it holds the last node, n31); any smaller candidate of
    # the chain takes a minute, like a long engine build (reprokit's one-node Identity probe of
    # the check, which holds no node of the chain, answers at once).
    import sys, time
    data = open(sys.argv[1], "rb").read()
    if b"n31" not in data and b"reprokit_probe" not in data:
        time.sleep(60)
    if b"Sigmoid" in data and b"Tanh" in data:
        print("[E] Error Code 2: unsupported pair")
        sys.exit(1)
"""

FUSION_SCRIPT = """
    # An engine with a buggy Conv+Relu fusion: when a Conv's output is read only by a Relu and is
    # not a graph output (so the pair is fused), the fused Relu's result comes out 1.5x too big.
    # Marking the Conv output as a graph output prevents the fusion, and the bug vanishes.
    import sys
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load(sys.argv[1])
    feeds = dict(np.load(sys.argv[2]))
    graph = model.graph
    outputs = {o.name for o in graph.output}
    producer = {t: n for n in graph.node for t in n.output}
    readers = {}
    for n in graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    nodes = []
    for n in graph.node:
        nodes.append(n)
        src = producer.get(n.input[0]) if n.input else None
        if (n.op_type == "Relu" and src is not None and src.op_type == "Conv"
                and len(readers[n.input[0]]) == 1 and n.input[0] not in outputs):
            wanted = n.output[0]
            n.output[0] = wanted + "__fused"
            nodes.append(helper.make_node("Mul", [wanted + "__fused", "__bug"], [wanted]))
            graph.initializer.append(numpy_helper.from_array(np.array(1.5, np.float32), "__bug"))
    del graph.node[:]
    graph.node.extend(nodes)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    np.savez(sys.argv[3], **dict(zip(names, session.run(names, feeds))))
"""


def write_script(directory, name: str, text: str) -> str:
    path = os.path.join(os.fspath(directory), name)
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(text).lstrip())
    return path


# Answers by a fixed sequence, one letter per call (F fails, P passes), whatever the model.
SEQUENCE_CHECK = """
import sys
with open({log!r}, "a+") as handle:
    handle.seek(0)
    count = len(handle.read().splitlines())
    handle.write(sys.argv[1] + "\\n")
if {sequence!r}[count % len({sequence!r})] == "F":
    print("FLAKY FAILURE")
    sys.exit(1)
"""
