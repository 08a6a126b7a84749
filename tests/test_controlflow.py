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

from reprokit.graph.controlflow import open_control_flow
from reprokit.graph.index import count_nodes

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


def rank_in_branch_model():
    """x[1,4,8], flag bool → a = Relu(x); If(flag):
        then: m = Mul(a, 2) → n = Neg(m) → s = Squeeze(n, [0]) [4,8]; t = Tanh(a) → If(flag2): Sigmoid(t) | Identity(t)
        else: Identity(a) [1,4,8]; Identity(a)
    → Conv(if_out, w) — the If's output rank is unknown (3 or 2): OpenVINO refuses the Conv"""
    inner_then = helper.make_graph([helper.make_node("Sigmoid", ["t"], ["g"], name="then/inner/sigmoid")],
                                   "inner_then", [], [_value("g", [1, 4, 8])])
    inner_else = helper.make_graph([helper.make_node("Identity", ["t"], ["h"], name="then/inner/id")],
                                   "inner_else", [], [_value("h", [1, 4, 8])])
    then = helper.make_graph(
        [helper.make_node("Mul", ["a", "two"], ["m"], name="then/mul"),
         helper.make_node("Neg", ["m"], ["n"], name="then/neg"),
         helper.make_node("Squeeze", ["n", "axes"], ["s"], name="then/squeeze"),
         helper.make_node("Tanh", ["a"], ["t"], name="then/tanh"),
         helper.make_node("If", ["flag2"], ["side"], name="then/if", then_branch=inner_then, else_branch=inner_else)],
        "then", [], [_value("s", [4, 8]), _value("side", [1, 4, 8])],
        [_const("two", 2.0), numpy_helper.from_array(np.array([0], np.int64), "axes")])
    other = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["e"], name="else/id"),
         helper.make_node("Identity", ["a"], ["e2"], name="else/id2")],
        "else", [], [_value("e", [1, 4, 8]), _value("e2", [1, 4, 8])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("If", ["flag"], ["b", "side_out"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Conv", ["b", "w"], ["y"], name="conv"),
             helper.make_node("Sigmoid", ["side_out"], ["z"], name="side")]
    graph = helper.make_graph(nodes, "rank", [_value("x", [1, 4, 8]), _value("flag", [], TensorProto.BOOL),
                                              _value("flag2", [], TensorProto.BOOL)],
                              [_value("y", [1, 2, 8]), _value("z", [1, 4, 8])], [_const("w", np.ones((2, 4, 1)))])
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
        from reprokit.graph.model import mark_outputs

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
    # the emulator clamps the weight 1e5 to 65504 (as TensorRT does): a past 1 still overflows fp16
    x = np.linspace(1.5, 1.9, 8, dtype=np.float32).reshape(1, 8)
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
    from reprokit.errors import ExitCode, ReprokitError
    from reprokit.shrink import start
    from reprokit.shrink import steps as shrinking

    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"], name="neg")],
        "g", [_value("x", [1, 4])], [_value("y", [1, 4])])
    model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    real = start.mark_outputs

    def broken_marking(m, names):
        marked = real(m, names)
        marked.graph.node[-1].input[0] = "no_such_tensor"  # a dangling reference, as a bad rename makes
        return marked

    monkeypatch.setattr(start, "mark_outputs", broken_marking)
    with pytest.raises(ReprokitError) as caught:
        shrinking.shrink(path, "emulate:fp16", str(tmp_path / "out"))
    assert caught.value.exit_code is ExitCode.INTERNAL
    assert "capturing reference activations" in str(caught.value) and "model as given runs" in str(caught.value)


def _branch(node, name):
    return next(a.g for a in node.attribute if a.name == name)


def test_cuts_inside_a_branch_read_captured_values_or_zeros_where_the_branch_does_not_run():
    """Sites of rank_in_branch_model (flag False: the else branch runs): a removed node of the
    branch that does not run is fed zeros of its inferred shape; a branch output whose producer
    goes is refused; an If output nothing reads goes from the If and both branches."""
    from reprokit.graph.branchcut import Refused, Sites

    model = rank_in_branch_model()
    fed = {"x": np.ones((1, 4, 8), np.float32), "flag": np.array(False), "flag2": np.array(True)}
    a = np.ones((1, 4, 8), np.float32)
    captured = {"a": a, "b": a, "side_out": a, "y": np.zeros((1, 2, 8), np.float32), "z": a}

    class Store(dict):
        def get(self, name):
            return self[name]

        def info(self, name):
            return self[name].shape, self[name].dtype

    sites = Sites(model, Store(captured), fed)
    label = {}
    for number, site in enumerate(sites.sites):
        graph = model.graph
        for position, branch in site.path:
            graph = _branch(graph.node[position], branch)
        label[graph.node[site.position].name] = number
    every = frozenset(range(len(sites.sites)))
    assert len(every) == 13 and not sites.sites[label["then/neg"]].taken and sites.sites[label["else/id"]].taken
    without_neg = sites.extraction(every - {label["then/neg"]})
    assert np.array_equal(without_neg.feeds["n"], np.zeros((1, 4, 8), np.float32))
    without_relu = sites.extraction(every - {label["relu"]})
    assert np.array_equal(without_relu.feeds["a"], a)  # cut at the top level: the captured value
    assert "would be a name from outside" in sites.refused(every - {label["else/id"]})
    side = {label[n] for n in ("then/tanh", "then/if", "then/inner/sigmoid", "then/inner/id", "side")}
    dropped = sites.extraction(every - side - {label["else/id2"]}).model
    node = next(n for n in dropped.graph.node if n.op_type == "If")
    assert list(node.output) == ["b"] and [o.name for o in _branch(node, "else_branch").output] == ["e"]
    with pytest.raises(Refused):  # the If gone, its branches' nodes with it: nothing left
        sites.extraction(every - {label["relu"], label["branch"], label["conv"], label["side"]} - side)


@pytest.mark.slow
def test_shrink_reduces_inside_the_branches_of_the_if_an_engine_needs(tmp_path):
    """OpenVINO refuses the Conv only while the If's output rank is unknown (Squeeze in one
    branch, Identity in the other): opened, the rank is known, so the If stays — and the nodes
    inside its branches that play no part go (Mul, Neg, Tanh, the nested If, the side output)."""
    fed = feeds(tmp_path, x=np.linspace(0.1, 1, 32, dtype=np.float32).reshape(1, 4, 8), flag=np.array(False),
                flag2=np.array(True))
    got = shrink(tmp_path, rank_in_branch_model(), "openvino:f32", fed)
    minimal = got["model"]
    assert [n.op_type for n in minimal.graph.node] == ["If", "Conv"]
    node = minimal.graph.node[0]
    assert [n.name for n in _branch(node, "then_branch").node] == ["then/squeeze"]
    assert [n.name for n in _branch(node, "else_branch").node] == ["else/id"]
    assert got["original"]["nodes_with_subgraphs"] == 13 and got["minimal"]["nodes_with_subgraphs"] == 4
    inside = next(s for s in got["steps"] if s["step"] == "inside")
    assert inside["calls"] > 0 and inside["accepted"] > 0
    assert "rank has to be known" in got["signature"]["detail"]


MUL_IN_IF_CHECK = """\
# a numeric check that drifts (outputs x1.5) while an If branch holds a Mul: the If must stay
import sys, numpy as np, onnx, onnxruntime as ort
model_path, inputs, outputs = sys.argv[1:4]
m = onnx.load(model_path)
feeds = dict(np.load(inputs))
sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
names = [o.name for o in sess.get_outputs()]
res = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
def mul_in_if(g):
    return any(n.op_type == "If" and any(any(x.op_type == "Mul" for x in a.g.node) or mul_in_if(a.g)
                                         for a in n.attribute) for n in g.node)
bad = mul_in_if(m.graph)
np.savez(outputs, **{k: (v * 1.5 if bad and v.dtype.kind == "f" else v) for k, v in zip(names, res)})
"""


@pytest.mark.slow
def test_under_a_numeric_target_the_reduction_reaches_inside_the_branches(tmp_path):
    """x[1,8], flag → a = Abs(x); If(flag): then: Mul(Relu(a), 2) → Tanh; Sigmoid(a)
    else: Neg(a); Identity(a) → Exp(y) — a check whose outputs drift while a Mul sits in an If."""
    then = helper.make_graph([helper.make_node("Relu", ["a"], ["r"], name="t/relu"),
                              helper.make_node("Mul", ["r", "two"], ["m"], name="t/mul"),
                              helper.make_node("Tanh", ["m"], ["o"], name="t/tanh"),
                              helper.make_node("Sigmoid", ["a"], ["o2"], name="t/sig")],
                             "then", [], [_value("o", [1, 8]), _value("o2", [1, 8])], [_const("two", 2.0)])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="e/neg"),
                               helper.make_node("Identity", ["a"], ["e2"], name="e/id")],
                              "else", [], [_value("e", [1, 8]), _value("e2", [1, 8])])
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"], name="abs"),
         helper.make_node("If", ["flag"], ["y", "y2"], name="if", then_branch=then, else_branch=other),
         helper.make_node("Exp", ["y"], ["z"], name="exp")],
        "g", [_value("x", [1, 8]), _value("flag", [], TensorProto.BOOL)], [_value("z", [1, 8]), _value("y2", [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    check = tmp_path / "mul_in_if.py"
    check.write_text(MUL_IN_IF_CHECK)
    fed = feeds(tmp_path, x=np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8), flag=np.array(True))
    got = shrink(tmp_path, model, f"cmd:{PY} {check} {{model}} {{inputs}} {{outputs}}", fed, "--one-by-one")
    minimal = got["model"]
    assert got["signature"]["kind"] == "mismatch" and got["signature"]["outputs"] == ["z", "y2"]
    # the causal test holds inside the branches too (issue 38): every failing output must fail
    # again, so the If keeps y2 beside y (y alone, injected, leaves y2 as the reference computes it)
    assert [n.op_type for n in minimal.graph.node] == ["If"] and list(minimal.graph.node[0].output) == ["y", "y2"]
    node = minimal.graph.node[0]
    assert [n.name for n in _branch(node, "then_branch").node] == ["t/mul", "t/tanh", "t/sig"]  # Relu's: captured
    assert [n.name for n in _branch(node, "else_branch").node] == ["e/neg", "e/id"]
    assert got["minimal"]["nodes_with_subgraphs"] == 6 and got["original"]["nodes_with_subgraphs"] == 9
    assert got["no_slippage"]["test"] == "causal injection" and got["no_slippage"]["rejected"] > 0


@pytest.mark.slow
def test_a_capture_inside_the_branches_the_reference_refuses_is_an_internal_error(tmp_path, monkeypatch):
    """Fault injection: the model the inside step captures on comes out with a dangling tensor
    reference. The model as given runs: exit 70, naming the step, never "the reference fails"."""
    from reprokit.errors import ExitCode, ReprokitError
    from reprokit.shrink import steps as shrinking
    from reprokit.shrink.passes import inside

    path = str(tmp_path / "m.onnx")
    onnx.save(rank_in_branch_model(), path)
    real = inside.mark_outputs

    def broken_marking(m, names):
        marked = real(m, names)
        marked.graph.node[-1].input[0] = "no_such_tensor"
        return marked

    monkeypatch.setattr(inside, "mark_outputs", broken_marking)  # only the inside step's capture
    fed = feeds(tmp_path, x=np.ones((1, 4, 8), np.float32), flag=np.array(False), flag2=np.array(True))
    from reprokit.api import RunOptions

    with pytest.raises(ReprokitError) as caught:
        shrinking.shrink(path, "openvino:f32", str(tmp_path / "out"), options=RunOptions(inputs=fed))
    assert caught.value.exit_code is ExitCode.INTERNAL
    assert "reducing inside If branches" in str(caught.value) and "model as given runs" in str(caught.value)
