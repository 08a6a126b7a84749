"""reprokit.convert: float32 → fp16/bf16 models, checked by onnx and run on onnxruntime CPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from reprokit.convert import convert_float_model, convert_float_model_report

RNG = np.random.default_rng(7)
F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])


def mlp_model():
    # x[3,8] ─MatMul(W)─ mm ─Add(B)─ a ─Relu─ r ─Softmax─ y
    w = numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "B"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1),
    ]
    x = helper.make_tensor_value_info("x", F32, [3, 8])
    y = helper.make_tensor_value_info("y", F32, [3, 4])
    return make_model(nodes, [x], [y], [w, b])


def constant_cast_model():
    # x ─Mul(Constant 0.5)─ m ─Add(Cast(i → float))─ y ;  x ─Cast(→ int64)─ xi
    nodes = [
        helper.make_node("Constant", [], ["half"], name="half", value_float=0.5),
        helper.make_node("Mul", ["x", "half"], ["m"], name="mul"),
        helper.make_node("Cast", ["i"], ["fi"], name="to_float", to=F32),
        helper.make_node("Add", ["m", "fi"], ["y"], name="add"),
        helper.make_node("Cast", ["x"], ["xi"], name="to_int", to=TensorProto.INT64),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F32, [2, 3]),
        helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", F32, [2, 3]),
        helper.make_tensor_value_info("xi", TensorProto.INT64, [2, 3]),
    ]
    return make_model(nodes, inputs, outputs)


def overflow_model():
    # x ─Mul(1000)─ big ─Div(1000)─ y   (big overflows fp16 for |x| > 65.5)
    k = numpy_helper.from_array(np.array(1000.0, np.float32), "k")
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["big"], name="scale_up"),
        helper.make_node("Div", ["big", "k"], ["y"], name="scale_down"),
    ]
    x = helper.make_tensor_value_info("x", F32, [4])
    y = helper.make_tensor_value_info("y", F32, [4])
    return make_model(nodes, [x], [y], [k])


def run(model, feeds):
    # graph optimizations off: ORT would otherwise fold Cast pairs and compute in float32
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def fp16_semantics(model, feeds):
    """Outputs with each op computed in its declared type (onnx's numpy reference evaluator).

    onnxruntime CPU has few fp16 kernels: it computes most fp16 ops in float32 and even drops
    the Casts around them, so overflow and rounding checks use this evaluator instead.
    """
    return ReferenceEvaluator(model).run(None, feeds)


def rel_l2(reference, value):
    reference, value = np.asarray(reference, np.float64), np.asarray(value, np.float64)
    return np.linalg.norm(reference - value) / max(np.linalg.norm(reference), 1e-30)


def tensor_types(model) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    entries = list(graph.input) + list(graph.output) + list(graph.value_info)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in entries}
    return types | {t.name: t.data_type for t in graph.initializer}


def test_mlp_fp16_is_valid_narrow_inside_float32_outside_and_close():
    model = mlp_model()
    converted = convert_float_model(model, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [F32]
    assert [o.type.tensor_type.elem_type for o in converted.graph.output] == [F32]
    assert {t.name: t.data_type for t in converted.graph.initializer} == {"W": F16, "B": F16}
    io = {"x", "y"}
    inside = {name: t for name, t in tensor_types(converted).items() if name not in io}
    assert inside and set(inside.values()) == {F16}, inside
    # every original tensor keeps its name; only the output's producer is renamed
    assert {"mm", "a", "r"} <= set(inside)
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    (expected,), (got,) = run(model, {"x": x}), run(converted, {"x": x})
    assert got.dtype == np.float32
    assert rel_l2(expected, got) < 1e-2
    (narrow,) = fp16_semantics(converted, {"x": x})
    assert 0 < rel_l2(expected, narrow) < 1e-2  # really rounded, within fp16 tolerance


def test_original_model_opset_and_ir_version_are_kept():
    model = mlp_model()
    before = model.SerializeToString()
    converted = convert_float_model(model, "fp16")
    assert model.SerializeToString() == before
    assert converted.ir_version == 8
    assert [(o.domain, o.version) for o in converted.opset_import] == [("", 17)]


def test_constant_and_cast_are_retargeted_and_int_cast_reads_float32():
    model = constant_cast_model()
    converted = convert_float_model(model, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    nodes = {n.name: n for n in converted.graph.node}
    assert nodes["half"].attribute[0].t.data_type == F16
    assert helper.get_attribute_value(nodes["to_float"].attribute[0]) == F16
    assert list(nodes["to_int"].input) == ["x"]  # no fp16 detour before the int cast
    x = np.array([[70000.5, 1.25, -3.0], [2.0, 2049.0, 0.1]], np.float32)
    i = np.arange(6, dtype=np.int64).reshape(2, 3)
    (y_ref, xi_ref), (y, xi) = run(model, {"x": x, "i": i}), run(converted, {"x": x, "i": i})
    np.testing.assert_array_equal(xi, xi_ref)  # 70000 survives: it never went through fp16
    assert rel_l2(y_ref, y) < 1e-2
    # true fp16 arithmetic: x = 70000.5 itself overflows fp16 on the way in
    with np.errstate(over="ignore"):
        (y16, xi16) = fp16_semantics(converted, {"x": x, "i": i})
    assert np.isinf(y16[0, 0]) and np.isfinite(y16.ravel()[1:]).all()
    np.testing.assert_array_equal(xi16, xi_ref)


def test_keep_fp32_node_computes_in_float32():
    model = overflow_model()
    x = np.array([100.0, -300.0, 1.5, 60.0], np.float32)
    narrow = convert_float_model(model, "fp16")
    onnx.checker.check_model(narrow, full_check=True)
    with np.errstate(over="ignore"):
        (y16,) = fp16_semantics(narrow, {"x": x})
    assert np.isinf(y16[:2]).all()  # 1e5 overflows fp16

    kept, report = convert_float_model_report(model, "fp16", {"scale_up", "scale_down"})
    onnx.checker.check_model(kept, full_check=True)
    assert report.kept_fp32 == ("scale_down", "scale_up")
    types = tensor_types(kept)
    assert types["big"] == F32 and types["y"] == F32
    nodes = {n.name: n for n in kept.graph.node}
    assert [types[name] for name in nodes["scale_up"].input] == [F32, F32]
    (y,) = fp16_semantics(kept, {"x": x})
    np.testing.assert_allclose(y, x, rtol=1e-6)
    np.testing.assert_allclose(run(kept, {"x": x})[0], x, rtol=1e-6)


def test_keep_fp32_node_between_narrow_nodes_gets_casts_both_ways():
    model = mlp_model()
    converted, report = convert_float_model_report(model, "fp16", {"add"})
    onnx.checker.check_model(converted, full_check=True)
    types = tensor_types(converted)
    add = next(n for n in converted.graph.node if n.name == "add")
    assert [types[name] for name in add.input] == [F32, F32]
    assert types[add.output[0]] == F32
    assert types["mm"] == F16 and types["r"] == F16
    assert {t.name: t.data_type for t in converted.graph.initializer}["B"] == F32
    assert report.casts == 4
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    assert rel_l2(run(model, {"x": x})[0], run(converted, {"x": x})[0]) < 1e-2


def test_unknown_keep_fp32_node_is_an_error():
    with pytest.raises(ValueError, match="no node named 'nope'"):
        convert_float_model(mlp_model(), "fp16", {"nope"})


def test_resize_scales_and_constant_of_shape_follow_the_schema():
    # x ─Resize(scales: Constant)─ up ─Add(ConstantOfShape(Shape(up)))─ y
    nodes = [
        helper.make_node(
            "Constant", [], ["scales"], name="scales",
            value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32)),
        ),
        helper.make_node("Resize", ["x", "", "scales"], ["up"], name="resize", mode="nearest"),
        helper.make_node("Shape", ["up"], ["shape"], name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros"),
        helper.make_node("Add", ["up", "zeros"], ["y"], name="add"),
    ]  # fmt: skip
    x = helper.make_tensor_value_info("x", F32, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", F32, [1, 1, 4, 4])
    model = make_model(nodes, [x], [y])
    converted = convert_float_model(model, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    types = tensor_types(converted)
    assert types["scales"] == F32  # Resize-13 takes tensor(float) scales only
    assert types["up"] == F16 and types["zeros"] == F16
    feed = {"x": RNG.standard_normal((1, 1, 2, 2)).astype(np.float32)}
    assert rel_l2(run(model, feed)[0], run(converted, feed)[0]) < 1e-2


def test_if_branches_reading_outer_tensors_are_converted():
    # x ─If(c){then: Mul(x, W) ─ Neg ; else: Abs(x)}─ y
    w = numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "W")
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "W"], ["t"], name="t_mul"), helper.make_node("Neg", ["t"], ["o1"], name="t_neg")],
        "then", [], [helper.make_tensor_value_info("o1", F32, [3])],
    )  # fmt: skip
    else_branch = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["o2"], name="e_abs")],
        "else", [], [helper.make_tensor_value_info("o2", F32, [3])],
    )  # fmt: skip
    node = helper.make_node(
        "If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch
    )
    inputs = [
        helper.make_tensor_value_info("x", F32, [3]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, []),
    ]
    model = make_model([node], inputs, [helper.make_tensor_value_info("y", F32, [3])], [w])
    for keep in (set(), {"t_neg"}):
        converted = convert_float_model(model, "fp16", keep)
        onnx.checker.check_model(converted, full_check=True)
        for cond in (True, False):
            feed = {"x": RNG.standard_normal(3).astype(np.float32), "c": np.array(cond)}
            assert rel_l2(run(model, feed)[0], run(converted, feed)[0]) < 1e-2


def test_bf16_conversion_rounds_weights_and_keeps_ops_the_opset_cannot_type():
    # x ─Conv(W)─ c ─Relu─ y   (opset 17: Conv has no bfloat16, Relu has)
    weight = RNG.standard_normal((2, 1, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", F32, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", F32, [1, 2, 4, 4])
    model = make_model(nodes, [x], [y], [numpy_helper.from_array(weight, "W")])
    converted, report = convert_float_model_report(model, "bf16")
    onnx.checker.check_model(converted, full_check=True)
    assert report.schema_fp32 == ("conv",)
    types = tensor_types(converted)
    assert types["c"] == F32 and types["y__rk_bf16"] == BF16
    assert {t.name: t.data_type for t in converted.graph.initializer} == {"W": F32}


def test_bf16_weights_are_rounded_to_nearest_bfloat16():
    # x ─Mul(W)─ y
    weight = RNG.standard_normal(6).astype(np.float32)
    model = make_model(
        [helper.make_node("Mul", ["x", "W"], ["y"], name="mul")],
        [helper.make_tensor_value_info("x", F32, [6])],
        [helper.make_tensor_value_info("y", F32, [6])],
        [numpy_helper.from_array(weight, "W")],
    )
    converted = convert_float_model(model, "bf16")
    onnx.checker.check_model(converted, full_check=True)
    (init,) = converted.graph.initializer
    assert init.data_type == BF16
    stored = np.frombuffer(init.raw_data, np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(stored, weight.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert tensor_types(converted)["y__rk_bf16"] == BF16


def test_out_of_range_weights_are_clamped_like_tensorrt():
    # x ─Add(big)─ y   with big = [1e6, -1e6, inf]
    big = numpy_helper.from_array(np.array([1e6, -1e6, np.inf], np.float32), "big")
    model = make_model(
        [helper.make_node("Add", ["x", "big"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", F32, [3])],
        [helper.make_tensor_value_info("y", F32, [3])],
        [big],
    )
    converted = convert_float_model(model, "fp16")
    (init,) = converted.graph.initializer
    np.testing.assert_array_equal(
        numpy_helper.to_array(init), np.array([65504, -65504, np.inf], np.float16)
    )


def test_output_read_inside_the_graph_stays_float32_at_the_boundary_only():
    # x ─Relu─ r (graph output too) ─Sigmoid─ y
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["y"], name="sig"),
    ]
    x = helper.make_tensor_value_info("x", F32, [5])
    outs = [
        helper.make_tensor_value_info("r", F32, [5]),
        helper.make_tensor_value_info("y", F32, [5]),
    ]
    model = make_model(nodes, [x], outs)
    converted = convert_float_model(model, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    sig = next(n for n in converted.graph.node if n.name == "sig")
    assert tensor_types(converted)[sig.input[0]] == F16
    feed = {"x": RNG.standard_normal(5).astype(np.float32)}
    for expected, got in zip(run(model, feed), run(converted, feed), strict=True):
        assert got.dtype == np.float32 and rel_l2(expected, got) < 1e-2


def test_unknown_target_type_is_an_error():
    with pytest.raises(ValueError, match="fp16, bf16"):
        convert_float_model(mlp_model(), "int8")


def test_calls_to_local_functions_stay_float32():
    # x ─Relu─ r ─local.Twice (a function: Mul(a, Constant 2.0))─ y
    twice = helper.make_function(
        "local", "Twice", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], value_float=2.0), helper.make_node("Mul", ["a", "k"], ["b"])],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Twice", ["r"], ["y"], domain="local", name="twice")],
        "g", [helper.make_tensor_value_info("x", F32, [3])], [helper.make_tensor_value_info("y", F32, [3])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, ir_version=8, opset_imports=opsets, functions=[twice])
    converted, report = convert_float_model_report(model, "fp16")
    onnx.checker.check_model(converted, full_check=True)
    assert report.schema_fp32 == ("twice",)
    assert tensor_types(converted)["r"] == F16
    feed = {"x": np.array([1.0, -2.0, 3.5], np.float32)}
    np.testing.assert_allclose(run(converted, feed)[0], [2.0, 0.0, 7.0])
