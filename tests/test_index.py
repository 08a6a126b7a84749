"""graph/index.py, the one scope walker: what a node's bodies read from outside (node inputs and
body outputs, through nested bodies, minus what each scope defines), renaming those reads with
shadowing, every node of a graph with its bodies, and GraphIndex's producers and consumers.
Pure graph facts: no engine runs. The If models are checked by onnx's checker first."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from reprokit.graph.index import (
    GraphIndex,
    count_nodes,
    defined_names,
    iter_nodes,
    node_names,
    node_reads,
    outer_refs,
    outer_scope_names,
    rename_outer_refs,
    rename_reads,
)


def vi(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def branch(node, name):
    return next(attr.g for attr in node.attribute if attr.name == name)


def nested_if_model():
    # x ─Relu(r)─ a ─┬─────────────────────────────────────────────── Neg(after) ─ y
    #   flag ─If(outer)─ z   then: Add(a, w) → t ─If(inner, flag) → z    else: Identity(a) → z
    #                           inner then: Mul(t, b) → u    inner else: Identity(a) → u
    # (``w`` is an initializer of the outer then-branch; ``b`` an outer tensor read two levels down)
    inner_then = helper.make_graph([helper.make_node("Mul", ["t", "b"], ["u"], name="mul")], "inner_then", [], [vi("u")])
    inner_else = helper.make_graph([helper.make_node("Identity", ["a"], ["u2"], name="id2")], "inner_else", [], [vi("u2")])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    then = helper.make_graph([
        helper.make_node("Add", ["a", "w"], ["t"], name="add"),
        helper.make_node("If", ["flag"], ["z1"], name="inner", then_branch=inner_then, else_branch=inner_else),
    ], "then", [], [vi("z1")], initializer=[w])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["z2"], name="id")], "else", [], [vi("z2")])
    graph = helper.make_graph([
        helper.make_node("Relu", ["x"], ["a"], name="r"),
        helper.make_node("Neg", ["x"], ["b"], name="neg"),
        helper.make_node("If", ["flag"], ["z"], name="outer", then_branch=then, else_branch=other),
        helper.make_node("Neg", ["a"], ["y"], name="after"),
    ], "g", [vi("x"), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])], [vi("z"), vi("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_outer_reads_go_through_nested_bodies_and_stop_at_what_a_scope_defines():
    model = nested_if_model()
    outer = model.graph.node[2]
    then = branch(outer, "then_branch")
    assert defined_names(then) == {"w", "t", "z1"}
    # a (read by Add and by the inner else), b (read two levels down), flag (the inner If's
    # condition); t and w are the then-branch's own
    assert outer_scope_names(outer) == {"a", "b", "flag"}
    assert node_reads(outer) == ("flag", "a", "b")  # its condition first, then the bodies' reads


def test_a_body_output_that_names_an_outer_tensor_is_a_read():
    body = helper.make_graph([], "passthrough", [], [vi("a")])  # returns the outer ``a`` as it is
    node = helper.make_node("If", ["flag"], ["z"], then_branch=body, else_branch=body)
    assert outer_refs(body) == {"a"}
    assert outer_scope_names(node) == {"a"}


def test_index_has_producers_and_consumers_with_bodies_reads():
    index = GraphIndex.build(nested_if_model())
    assert index.producer == {"a": 0, "b": 1, "z": 2, "y": 3}
    assert index.consumers["a"] == [2, 3]  # the If reads it inside its branches
    assert index.consumers["b"] == [2]
    assert index.consumers["x"] == [0, 1]
    assert index.descendants(0) == {0, 2, 3}
    assert index.ancestors(2) == {0, 1, 2}


def test_rename_outer_refs_renames_reads_and_outputs_but_not_what_a_body_defines():
    model = nested_if_model()
    then = branch(model.graph.node[2], "then_branch")
    rename_outer_refs(then, {"a": "A", "b": "B", "t": "T", "w": "W"})
    assert list(then.node[0].input) == ["A", "w"]  # w and t are the branch's own: kept
    inner_then, inner_else = branch(then.node[1], "then_branch"), branch(then.node[1], "else_branch")
    assert list(inner_then.node[0].input) == ["t", "B"]
    assert list(inner_else.node[0].input) == ["A"]
    body = helper.make_graph([], "passthrough", [], [vi("a")])
    rename_outer_refs(body, {"a": "A"})
    assert body.output[0].name == "A"


def test_rename_reads_renames_a_scopes_own_reads_and_its_bodies_but_keeps_its_outputs():
    model = nested_if_model()
    rename_reads(model.graph, {"a": "a16", "y": "y16"})
    assert list(model.graph.node[3].input) == ["a16"]
    then = branch(model.graph.node[2], "then_branch")
    assert list(then.node[0].input) == ["a16", "w"]
    assert [o.name for o in model.graph.output] == ["z", "y"]


def test_every_node_of_a_graph_with_its_bodies():
    model = nested_if_model()
    # depth first, a node's bodies in attribute order (onnx sorts them: else_branch first)
    assert node_names(model.graph) == ["r", "neg", "outer", "after", "id", "add", "inner", "id2", "mul"]
    assert count_nodes(model.graph) == 9 == sum(1 for _ in iter_nodes(model.graph))
