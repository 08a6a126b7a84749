"""Control flow: shrink reaches inside If branches (outer-scope references, a nested If) and
unrolled Loops; an engine that fails only inside an If keeps a wrapper; a model reprokit builds
that the reference refuses is reprokit's internal error, not the user's model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import PY, run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.controlflow import count_nodes, open_control_flow

F = TensorProto.FLOAT


def _value(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def if_and_loop_model() -> onnx.ModelProto:
    """x[1,8], mode (int64 scalar, like silero's sr) →
    a = Relu(x); If(mode == 1):
        then: m = Mul(a, 1e5)  [reads a from the outer graph]  ← overflows fp16
              If(ReduceSum(a) > 0): then: Neg(Div(m, 1e5)) else: Identity(m)
        else: Identity(a)
    → Loop 3 times: v = Mul(v, 0.5) → y"""
    inner_then = helper.make_graph(
        [helper.make_node("Div", ["m", "big_in"], ["d"], name="inner/div"),
         helper.make_node("Neg", ["d"], ["inner_out"], name="inner/neg")],
        "inner_then", [], [_value("inner_out", [1, 8])], [_const("big_in", 1e5)])
    inner_else = helper.make_graph([helper.make_node("Identity", ["m"], ["inner_id"], name="inner/id")],
                                   "inner_else", [], [_value("inner_id", [1, 8])])
    then = helper.make_graph(
        [helper.make_node("Mul", ["a", "big"], ["m"], name="then/mul"),
         helper.make_node("ReduceSum", ["a"], ["s"], name="then/sum", keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["c2"], name="then/greater"),
         helper.make_node("If", ["c2"], ["then_out"], name="then/if", then_branch=inner_then, else_branch=inner_else)],
        "then", [], [_value("then_out", [1, 8])], [_const("big", 1e5), _const("zero", 0.0)])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["else_out"], name="else/id")],
                              "else", [], [_value("else_out", [1, 8])])
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "half"], ["v_out"], name="loop/mul"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="loop/cond")],
        "body", [_value("i", [], TensorProto.INT64), _value("c_in", [], TensorProto.BOOL), _value("v_in", [1, 8])],
        [_value("c_out", [], TensorProto.BOOL), _value("v_out", [1, 8])], [_const("half", 0.5)])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Equal", ["mode", "one"], ["c"], name="is_one"),
             helper.make_node("If", ["c"], ["h"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Loop", ["trips", "", "h"], ["y"], name="loop", body=body)]
    graph = helper.make_graph(nodes, "cf", [_value("x", [1, 8]), _value("mode", [], TensorProto.INT64)],
                              [_value("y", [1, 8])],
                              [numpy_helper.from_array(np.array(1, np.int64), "one"),
                               numpy_helper.from_array(np.array(3, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def loop_overflow_model() -> onnx.ModelProto:
    """v = x in [0.5, 1); Loop 3 times: v = Mul(v, 100): 1e2, 1e4, 1e6 — the third overflows fp16."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "hundred"], ["v_out"], name="body/mul")],
        "body", [_value("i", [], TensorProto.INT64), _value("c_in", [], TensorProto.BOOL), _value("v_in", [1, 4])],
        [_value("c_in", [], TensorProto.BOOL), _value("v_out", [1, 4])], [_const("hundred", 100.0)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)], "loop",
        [_value("x", [1, 4])], [_value("y", [1, 4])], [numpy_helper.from_array(np.array(3, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds(tmp_path, **arrays) -> str:
    path = str(tmp_path / "feeds.npz")
    np.savez(path, **arrays)
    return path


def shrink(tmp_path, model, target, inputs, *extra) -> dict:
    path = str(tmp_path / "model.onnx")
    onnx.save(model, path)
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", target, "--inputs", inputs, "-o", str(out), "--no-pack", *extra)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    return {**summary, "stdout": proc.stdout, "model": onnx.load(str(out / "minimal.onnx"))}


def test_opening_computes_what_the_original_computes():
    import onnxruntime as ort

    model = if_and_loop_model()
    x = np.linspace(0.1, 0.9, 8, dtype=np.float32).reshape(1, 8) * 1e-3
    fed = {"x": x, "mode": np.array(1, np.int64)}

    def values(current, names):
        from reprokit.model import mark_outputs

        session = ort.InferenceSession(mark_outputs(current, names).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, fed)))

    levels = open_control_flow(model, values)
    assert len(levels) == 2  # the If and the Loop, then the nested If
    opened, notes = levels[-1]
    assert not any(n.op_type in ("If", "Loop") for n in opened.graph.node)
    assert count_nodes(opened.graph) >= 7 and any("unrolled its 3 iterations" in n for n in notes)
    onnx.checker.check_model(opened, full_check=True)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, fed)  # noqa: E731
    np.testing.assert_array_equal(run(model)[0], run(opened)[0])


@pytest.mark.slow
def test_shrink_reaches_the_node_inside_a_nested_if(tmp_path):
    x = np.linspace(0.5, 0.9, 8, dtype=np.float32).reshape(1, 8)
    got = shrink(tmp_path, if_and_loop_model(), "emulate:fp16", feeds(tmp_path, x=x, mode=np.array(1, np.int64)))
    assert got["minimal"]["node_names"] == ["then/mul"]
    assert got["original"]["nodes_with_subgraphs"] == 14 and got["original"]["file_nodes"] == 4
    assert "control flow opened" in got["stdout"]


@pytest.mark.slow
def test_shrink_reaches_the_loop_iteration_that_overflows(tmp_path):
    x = np.linspace(0.5, 0.9, 4, dtype=np.float32).reshape(1, 4)
    got = shrink(tmp_path, loop_overflow_model(), "emulate:fp16", feeds(tmp_path, x=x))
    assert got["minimal"]["ops"] == ["Mul"]
    assert got["minimal"]["node_names"] == ["loop/iter2/body/mul"]  # the third iteration


INSIDE_IF_CHECK = """
import sys, onnx
def inside(graph, depth=0):
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                if depth == 0 and node.op_type == "If" and any(n.op_type == "Conv" for n in attr.g.node):
                    return True
                if inside(attr.g, depth + 1):
                    return True
    return False
if inside(onnx.load(sys.argv[1]).graph):
    print("[E] cannot convert a Conv inside an If")
    sys.exit(1)
"""


@pytest.mark.slow
def test_an_engine_that_fails_only_inside_an_if_keeps_a_wrapper_around_the_minimal_nodes(tmp_path):
    w = _const("w", np.ones((2, 2, 1, 1)))
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="in/relu"),
         helper.make_node("Conv", ["r", "w"], ["conv_out"], name="in/conv"),
         helper.make_node("Sigmoid", ["conv_out"], ["s"], name="in/sigmoid"),
         helper.make_node("Tanh", ["s"], ["then_out"], name="in/tanh")],
        "then", [], [_value("then_out", [1, 2, 4, 4])], [w])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["else_out"], name="else/id")],
                              "else", [], [_value("else_out", [1, 2, 4, 4])])
    graph = helper.make_graph(
        [helper.make_node("Greater", ["flag", "zero"], ["c"], name="gt"),
         helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
        "g", [_value("x", [1, 2, 4, 4]), _value("flag", [])], [_value("y", [1, 2, 4, 4])], [_const("zero", 0.0)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    check = tmp_path / "inside_if.py"
    check.write_text(INSIDE_IF_CHECK)
    fed = feeds(tmp_path, x=np.ones((1, 2, 4, 4), np.float32), flag=np.array(1.0, np.float32))
    got = shrink(tmp_path, model, f"cmd:{PY} {check} {{model}}", fed, "--replays", "0")
    minimal = got["model"]
    assert [n.op_type for n in minimal.graph.node] == ["If"]
    assert got["minimal"]["nodes_with_subgraphs"] == 3  # the If, and the Conv in each branch
    body = next(a.g for a in minimal.graph.node[0].attribute if a.name == "then_branch")
    assert [n.name for n in body.node] == ["in/conv"]
    assert "each candidate kept inside an If" in got["stdout"]


def test_a_rewrite_the_reference_refuses_is_an_internal_error_naming_the_step(tmp_path, monkeypatch):
    """Fault injection: the capture model comes out with a dangling tensor reference. The model as
    given runs: the error is reprokit's, exit 70, naming the step."""
    from reprokit import shrink as shrinking
    from reprokit.errors import ExitCode, ReprokitError

    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")],
        "g", [_value("x", [1, 4])], [_value("y", [1, 4])])
    model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    real = shrinking.mark_outputs

    def broken_marking(m, names):
        marked = real(m, names)
        marked.graph.node[-1].input[0] = "no_such_tensor"  # a dangling reference, as a bad rename makes
        return marked

    monkeypatch.setattr(shrinking, "mark_outputs", broken_marking)
    with pytest.raises(ReprokitError) as caught:
        shrinking.shrink(path, "emulate:fp16", str(tmp_path / "out"))
    assert caught.value.exit_code is ExitCode.INTERNAL
    assert "capturing reference activations" in str(caught.value) and "model as given runs" in str(caught.value)
