"""Property test: random valid ONNX graphs of common ops through check, shrink and pack/verify.

Whatever the graph, reprokit never fails with an internal error (a ReprokitError is a user-facing
answer; anything else, or ExitCode.INTERNAL, is a bug), and a minimal model shrink writes shows
the original signature when judged alone. Real engines: onnxruntime, the fp16 storage emulator
and a pass/fail check command. A fixed budget (derandomized, few examples) keeps it under ~90 s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from reprokit.api import RunOptions, check
from reprokit.engine.bug import same_failure
from reprokit.errors import ExitCode, ReprokitError
from reprokit.shrink.steps import shrink

pytestmark = pytest.mark.slow
BUDGET = settings(derandomize=True, max_examples=6, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))

# sampled_from draws simplest toward the first entry: the ones that find something come first
UNARY = ["Exp", "Sigmoid", "Tanh", "Softmax", "Relu", "Abs", "Neg"]
BINARY = ["Add", "Sub", "Mul"]
FAILING = {"Sigmoid", "Softmax", "Tanh"}  # what the pass/fail check command refuses
STEPS = ["matmul", "unary", "unary", "unary", "binary", "matmul", "gemm", "conv", "layernorm", "batchnorm", "reduce", "transpose",
         "concat", "slice", "reshape", "where", "cast", "clip"]


@dataclass
class Builder:
    """Grows a graph op by op; every float tensor [N, M] (or [M, N]) with its shape."""

    draw: object
    rows: int
    cols: int
    nodes: list = field(default_factory=list)
    inits: dict = field(default_factory=dict)
    tensors: list = field(default_factory=list)  # (name, shape)

    def name(self, op: str) -> str:
        return f"{op.lower()}{len(self.nodes)}"

    def weight(self, shape, scale=1.0, share=True) -> str:
        for name, array in self.inits.items():  # a shared initializer read by several nodes
            if share and array.shape == tuple(shape) and self.draw(st.booleans()):
                return name
        name = f"w{len(self.inits)}"
        rng = np.random.default_rng(len(self.inits) + 17)
        self.inits[name] = (rng.normal(0, scale, shape)).astype(np.float32)
        return name

    def pick(self, shape=None):
        options = [t for t in self.tensors if shape is None or t[1] == shape]
        return self.draw(st.sampled_from(options)) if options else None

    def add(self, op, inputs, shape, **attrs):
        name = self.name(op)
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        self.tensors.append((name, tuple(shape)))
        return name

    def step(self, kind: str) -> None:
        x, shape = self.pick()
        n, m = shape
        if kind == "unary":
            op = self.draw(st.sampled_from(UNARY))
            self.add(op, [x], shape, **({"axis": -1} if op == "Softmax" else {}))
        elif kind == "binary":
            other = self.pick(shape)
            y = other[0] if other and self.draw(st.booleans()) else self.weight(shape)
            self.add(self.draw(st.sampled_from(BINARY)), [x, y], shape)
        elif kind == "matmul":
            k = self.draw(st.sampled_from([m, 6]))
            self.add("MatMul", [x, self.weight((m, k), scale=self.draw(st.sampled_from([3e4, 0.5])))], (n, k))
        elif kind == "gemm":  # C left out (optional input)
            self.add("Gemm", [x, self.weight((m, m))], (n, m), transB=1)
        elif kind == "conv":  # [N, M] -> [1, N, M, 1] -> 3x1 conv, pads 1 -> back
            four = self.add("Reshape", [x, self.const_shape([1, n, m, 1])], (1, n, m, 1))
            self.tensors.pop()
            conv = self.add("Conv", [four, self.weight((n, n, 3, 1)), self.weight((n,), share=False)],
                            (1, n, m, 1), pads=[1, 0, 1, 0])
            self.tensors.pop()
            self.add("Reshape", [conv, self.const_shape([n, m])], shape)
        elif kind == "layernorm":
            self.add("LayerNormalization", [x, self.weight((m,)), self.weight((m,))], shape, axis=-1)
        elif kind == "batchnorm":  # [N, M] read as N samples of M channels
            var = f"var{len(self.inits)}"
            self.inits[var] = np.full(m, 1.5, dtype=np.float32)
            self.add("BatchNormalization", [x, self.weight((m,)), self.weight((m,)), self.weight((m,)), var],
                     shape)
        elif kind == "reduce":  # [N, M] -> [N, 1], broadcast back by an Add
            op = self.draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax"]))
            reduced = self.add(op, [x, self.const_shape([1])], (n, 1), keepdims=1)
            self.tensors.pop()
            self.add("Sub", [x, reduced], shape)
        elif kind == "transpose":
            self.add("Transpose", [x], (m, n), perm=[1, 0])
        elif kind == "concat":
            other = self.pick(shape)[0]
            self.add("Concat", [x, other], (n, 2 * m), axis=1)
        elif kind == "slice" and m > 1:
            self.add("Slice", [x, self.const_shape([0]), self.const_shape([m // 2]), self.const_shape([1])],
                     (n, m // 2))
        elif kind == "reshape":
            self.add("Reshape", [x, self.const_shape([m, n])], (m, n))
        elif kind == "where":
            positive = self.add("Greater", [x, self.weight(shape, share=False)], shape)
            self.tensors.pop()
            self.add("Where", [positive, x, self.pick(shape)[0]], shape)
        elif kind == "cast":  # through fp16 and back, or through int32
            middle = self.draw(st.sampled_from([TensorProto.FLOAT16, TensorProto.INT32]))
            narrow = self.add("Cast", [x], shape, to=middle)
            self.tensors.pop()
            self.add("Cast", [narrow], shape, to=TensorProto.FLOAT)
        elif kind == "clip":  # min left empty (optional input)
            self.add("Clip", [x, "", self.scalar(self.draw(st.sampled_from([0.5, 6.0])))], shape)

    def const_shape(self, values) -> str:
        name = f"c{len(self.inits)}"
        self.inits[name] = np.asarray(values, dtype=np.int64)
        return name

    def scalar(self, value: float) -> str:
        name = f"s{len(self.inits)}"
        self.inits[name] = np.asarray(value, dtype=np.float32)
        return name


@st.composite
def graphs(draw):
    """A valid model: 1–2 inputs, 2–7 ops from the catalogue, 1–3 outputs."""
    rows, cols = draw(st.integers(2, 4)), draw(st.integers(3, 6))
    builder = Builder(draw, rows, cols)
    inputs = ["x"] + (["x2"] if draw(st.booleans()) else [])
    builder.tensors = [(name, (rows, cols)) for name in inputs]
    for kind in draw(st.lists(st.sampled_from(STEPS), min_size=2, max_size=7)):
        builder.step(kind)
    produced = builder.tensors[len(inputs):] or builder.tensors
    last = produced[-1]
    extra = draw(st.lists(st.sampled_from(produced), max_size=2, unique=True))
    outputs = list(dict.fromkeys([last] + extra))
    used = {i for node in builder.nodes for i in node.input}
    graph = helper.make_graph(
        builder.nodes, "random",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [rows, cols]) for n in inputs if n in used or n == "x"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in builder.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _no_internal_error(call):
    """The call's result, or None for a user-facing ReprokitError; an internal error fails."""
    try:
        return call()
    except ReprokitError as exc:
        assert exc.exit_code is not ExitCode.INTERNAL, exc.message
        return None


def _save(model, folder) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "model.onnx")
    onnx.save(model, path)
    return path


@BUDGET
@given(model=graphs())
def test_random_graphs_check_shrink_pack_verify_under_fp16_emulation(model, tmp_path_factory):
    from reprokit.report.verify import verify
    from reprokit.shrink.steps import pack_result

    folder = tmp_path_factory.mktemp("fp16")
    path = _save(model, folder)
    options = RunOptions(seed=1, val_ranges={None: (-4.0, 4.0)})
    checked = _no_internal_error(lambda: check(path, "emulate:fp16", options=options))
    event(f"check: {checked.verdict.kind.value if checked else 'user error'}")
    if checked is None or not checked.verdict.diverges:
        return
    result = _no_internal_error(lambda: shrink(path, "emulate:fp16", str(folder / "out"), options=options))
    event(f"shrink: {result.summary['status'] if result else 'user error'}")
    if result is None or not result.minimal_path:
        return
    alone = check(result.minimal_path, "emulate:fp16",
                  options=RunOptions(inputs=str(folder / "out" / "inputs.npz")))
    assert same_failure(alone.verdict.signature, result.verdict.signature), (alone.verdict.signature, result.verdict.signature)
    packed = _no_internal_error(lambda: pack_result(result, "emulate:fp16", options))
    event(f"pack: {'written' if packed else 'user error'}")
    if packed is not None:
        assert verify(packed.archive).reproduces


@BUDGET
@given(model=graphs())
def test_random_graphs_shrink_under_a_pass_fail_check_to_a_model_that_fails_alone(model, tmp_path_factory):
    """A check command that fails whenever a Sigmoid, Softmax or Tanh node is in the model (as
    a kernel bug would): the minimal model still fails alone, and holds such a node."""
    ops = {n.op_type for n in model.graph.node}
    folder = tmp_path_factory.mktemp("cmd")
    path = _save(model, folder)
    script = folder / "check.py"
    script.write_text("import sys, onnx\n"
                      "ops = {n.op_type for n in onnx.load(sys.argv[1]).graph.node}\n"
                      "sys.exit(1 if ops & {'Sigmoid', 'Softmax', 'Tanh'} else 0)\n")
    target = f"cmd:{sys.executable} {script} {{model}}"
    result = _no_internal_error(lambda: shrink(path, target, str(folder / "out"), options=RunOptions(seed=1)))
    event(f"cmd shrink: {'nothing to reduce' if result is None else result.summary['status']}")
    if not ops & FAILING:
        assert result is None  # nothing to reduce: a clean answer, not a crash
        return
    assert result is not None and result.minimal_path
    minimal = onnx.load(result.minimal_path)
    assert {n.op_type for n in minimal.graph.node} & FAILING
    alone = check(result.minimal_path, target, options=RunOptions(inputs=str(folder / "out" / "inputs.npz")))
    assert same_failure(alone.verdict.signature, result.verdict.signature)
