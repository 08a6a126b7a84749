"""Model shapes from the ONNX operator test corpus that once gave false verdicts (issue 19):
reprokit's own plumbing (port names, feeds, opset lifts, empty data sets, shape mismatches,
quoted messages), each run on real engines: onnxruntime, the storage emulator, OpenVINO."""

from __future__ import annotations

import os
import shlex
import sys

import numpy as np
import onnx
import pytest
from conftest import assert_user_error
from models import const, make, save, vi
from onnx import TensorProto, helper, numpy_helper

from reprokit.api import RunOptions, check
from reprokit.engine.oracle import Kind, Signature, quote_message
from reprokit.errors import ExitCode, ReferenceFailure, ReprokitError

INT64 = TensorProto.INT64
PY = shlex.quote(sys.executable)


def opset_model(nodes, inputs, outputs, initializers=(), opsets=(("", 18),), functions=()):
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, ir_version=8, functions=list(functions),
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    onnx.checker.check_model(model)
    return model


def write_npz(path, **arrays) -> str:
    np.savez(path, **arrays)
    return os.fspath(path)


@pytest.fixture
def openvino():
    pytest.importorskip("openvino", reason="openvino is not installed")


# 1. OpenVINO merges the names of a folded node into one port; get_any_name() may pick the other.


def folded_identity_output():
    # x[2,3] -> Relu -> a -> Identity -> y      (OpenVINO: one port named {a, y}; any name = 'a')
    return make([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])],
                [vi("x", [2, 3])], [vi("y", [2, 3])])


def folded_reshape_output():
    # x[2,3] -> Relu -> r -> Reshape([2,3]) -> y      (a no-op Reshape folds: port {r, y})
    shape = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "s")
    return make([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
                [vi("x", [2, 3])], [vi("y", [2, 3])], [shape])


@pytest.mark.parametrize("shape", [folded_identity_output, folded_reshape_output])
def test_openvino_output_of_a_folded_node_is_read_under_its_graph_name(tmp_path, openvino, shape):
    v = check(save(shape(), tmp_path / "m.onnx"), "openvino:f32").verdict
    assert v.signature == Signature(Kind.AGREE), v.message
    assert [o.name for o in v.outputs] == ["y"]


def test_openvino_graph_output_and_the_tensor_it_copies_are_both_read(tmp_path, openvino):
    # x[2,3] -> Relu -> a -> Identity -> y;  outputs a and y
    model = make([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["y"])],
                 [vi("x", [2, 3])], [vi("a", [2, 3]), vi("y", [2, 3])])
    v = check(save(model, tmp_path / "m.onnx"), "openvino:f32").verdict
    assert v.signature == Signature(Kind.AGREE), v.message
    assert [o.name for o in v.outputs] == ["a", "y"]


# 2. OpenVINO renames or drops inputs while it reads, and compiles dynamic shapes as dynamic.


def test_openvino_feeds_an_input_it_renamed(tmp_path, openvino):
    # x[3,4,5] -> Dropout (inference: identity) -> y      (OpenVINO names its only input 'y')
    model = opset_model([helper.make_node("Dropout", ["x"], ["y"], seed=0)], [vi("x", [3, 4, 5])],
                        [vi("y", [3, 4, 5])])
    v = check(save(model, tmp_path / "m.onnx"), "openvino:f32").verdict
    assert v.signature == Signature(Kind.AGREE), v.message


def test_openvino_skips_the_feed_of_an_input_it_folded_away(tmp_path, openvino):
    # data[3,2,2], axes[0] (empty: reduce all) -> ReduceMean(keepdims) -> reduced[1,1,1]
    model = opset_model([helper.make_node("ReduceMean", ["data", "axes"], ["reduced"], keepdims=1)],
                        [vi("data", [3, 2, 2]), vi("axes", [0], INT64)], [vi("reduced", [1, 1, 1])])
    feeds = write_npz(tmp_path / "feeds.npz", data=np.arange(12, dtype=np.float32).reshape(3, 2, 2),
                      axes=np.array([], dtype=np.int64))
    v = check(save(model, tmp_path / "m.onnx"), "openvino:f32", options=RunOptions(inputs=feeds)).verdict
    assert v.signature == Signature(Kind.AGREE), v.message


def test_openvino_compiles_for_the_feeds_shapes_not_dynamic_rank(tmp_path, openvino):
    # x[2,3] -> Reshape(s[K]) -> r (rank K: dynamic) -> ReduceSum(keepdims=0) -> y[]
    model = opset_model(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)],
        [vi("x", [2, 3]), vi("s", ["K"], INT64)], [vi("y", [])], opsets=(("", 17),))
    feeds = write_npz(tmp_path / "feeds.npz", x=np.arange(6, dtype=np.float32).reshape(2, 3),
                      s=np.array([3, 2], dtype=np.int64))
    v = check(save(model, tmp_path / "m.onnx"), "openvino:f32", options=RunOptions(inputs=feeds)).verdict
    assert v.signature == Signature(Kind.AGREE), v.message


def test_openvino_refusal_names_its_reason_first(tmp_path, openvino):
    # x[3,4,5], axes[1] (a runtime input) -> Unsqueeze -> y      (rank depends on axes' values:
    # OpenVINO's CPU plug-in refuses it, reshaped or not; the verdict must say so, not "core.cpp:117")
    model = opset_model([helper.make_node("Unsqueeze", ["x", "axes"], ["y"])],
                        [vi("x", [3, 4, 5]), vi("axes", [1], INT64)], [vi("y", [1, 3, 4, 5])])
    feeds = write_npz(tmp_path / "feeds.npz", x=np.ones((3, 4, 5), np.float32), axes=np.array([0], np.int64))
    v = check(save(model, tmp_path / "m.onnx"), "openvino:f32", options=RunOptions(inputs=feeds)).verdict
    assert v.signature.kind is Kind.BUILD_ERROR
    first = v.message.splitlines()[0]
    assert first.startswith("OpenVINO failed to compile the model: ") and "dynamic rank" in first
    assert "dynamic rank" in v.signature.detail


# 4. Storage emulation of models whose default-domain opset is absent or cannot be lifted.


def test_bf16_emulation_of_a_model_importing_only_ai_onnx_ml(tmp_path):
    # X[3,4] -> ai.onnx.ml.Binarizer(0.5) -> Y      (no default-domain opset at all)
    model = opset_model([helper.make_node("Binarizer", ["X"], ["Y"], domain="ai.onnx.ml", threshold=0.5)],
                        [vi("X", [3, 4])], [vi("Y", [3, 4])], opsets=(("ai.onnx.ml", 1),))
    values = np.array([[0.1, 0.9, 0.25, 0.75]] * 3, dtype=np.float32)  # far from 0.5 in bf16 too
    feeds = write_npz(tmp_path / "feeds.npz", X=values)
    v = check(save(model, tmp_path / "m.onnx"), "emulate:bf16", options=RunOptions(inputs=feeds)).verdict
    assert v.signature == Signature(Kind.AGREE), v.message


def test_bf16_emulation_keeps_local_functions_through_the_opset_lift(tmp_path):
    # X[3] -> local.MyRelu{Relu} -> Y      (opset 11: lifted to 13 for the bfloat16 Casts)
    body = helper.make_function("local", "MyRelu", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 11)])
    model = opset_model([helper.make_node("MyRelu", ["X"], ["Y"], domain="local")], [vi("X", [3])],
                        [vi("Y", [3])], opsets=(("", 11), ("local", 1)), functions=[body])
    v = check(save(model, tmp_path / "m.onnx"), "emulate:bf16").verdict
    assert v.signature == Signature(Kind.AGREE), v.message


def test_a_failed_opset_lift_is_a_clean_cannot_emulate_error(tmp_path, cli):
    # X[4] -> NoSuchOp -> Y      (opset 11: the version converter has no schema to lift it)
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["X"], ["Y"])], "g", [vi("X", [4])], [vi("Y", [4])])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 11)])
    save(model, tmp_path / "m.onnx")
    # As the reference it runs first, so the converter, not onnxruntime, meets the model.
    proc = cli("check", "m.onnx", "--reference", "emulate:bf16", "--target", "ort", cwd=tmp_path)
    assert_user_error(proc, int(ExitCode.ENVIRONMENT), contains="cannot emulate this model",
                      hint_contains="emulate:fp16")


# 5. A model without inputs has an empty test_data_set.


@pytest.mark.parametrize("target", ["emulate:fp16", "openvino:f32"])
def test_zero_input_model_accepts_an_empty_test_data_set(tmp_path, target):
    if target.startswith("openvino"):
        pytest.importorskip("openvino", reason="openvino is not installed")
    # Constant(values[2,3]) -> values      (no inputs)
    value = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "v")
    model = make([helper.make_node("Constant", [], ["values"], value=value)], [], [vi("values", [2, 3])])
    data_set = tmp_path / "test_data_set_0"
    data_set.mkdir()
    result = check(save(model, tmp_path / "m.onnx"), target, options=RunOptions(inputs=os.fspath(data_set)))
    assert result.prepared.feeds.arrays == {}
    assert result.verdict.signature == Signature(Kind.AGREE)


def test_a_test_data_set_holding_an_optional_is_checked(tmp_path, cli):
    # opt_in (optional<tensor<float>[5]>) -> Identity -> opt_out
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [5]))
    graph = helper.make_graph([helper.make_node("Identity", ["opt_in"], ["opt_out"])], "g",
                              [helper.make_value_info("opt_in", optional)],
                              [helper.make_value_info("opt_out", optional)])
    save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    data_set = tmp_path / "test_data_set_0"
    data_set.mkdir()
    value = numpy_helper.from_optional(np.ones(5, np.float32), "opt_in")
    (data_set / "input_0.pb").write_bytes(value.SerializeToString())
    proc = cli("check", "m.onnx", "--target", "emulate:fp16", "--inputs", "test_data_set_0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # optionals load (OptionalProto) and the emulator takes them
    assert "AGREES" in proc.stdout


def test_a_sequence_output_of_tensors_of_other_shapes_is_compared_element_by_element(tmp_path):
    # x[3,6] -> SplitToSequence(split=[1,2]) -> seq = [x[0:1], x[1:3]]      (ragged: no one array)
    split = numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "split")
    sequence = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    graph = helper.make_graph([helper.make_node("SplitToSequence", ["x", "split"], ["seq"])], "g",
                              [vi("x", [3, 6])], [helper.make_value_info("seq", sequence)], [split])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 18)])
    result = check(save(model, tmp_path / "m.onnx"), "emulate:fp16")
    assert result.verdict.signature == Signature(Kind.AGREE)
    assert {o.name: o.shape for o in result.verdict.outputs} == {"seq[0]": (1, 6), "seq[1]": (2, 6)}


# 6. Outputs of other shapes are a shape mismatch, not an infinite error.


def test_target_output_of_another_shape_is_a_shape_mismatch(tmp_path):
    # x[2,3] -> MatMul(W[3,4]) -> y[2,4]      (the check command writes y as [2,1,4])
    model = make([helper.make_node("MatMul", ["x", "W"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 4])],
                 [const("W", np.ones((3, 4)))])
    script = tmp_path / "reshaping_engine.py"
    script.write_text(
        "import sys, numpy as np\n"
        "x = np.load(sys.argv[1])['x']\n"
        "np.savez(sys.argv[2], y=(x @ np.ones((3, 4), np.float32)).reshape(2, 1, 4))\n")
    target = f"cmd:{PY} {shlex.quote(str(script))} {{inputs}} {{outputs}}"
    v = check(save(model, tmp_path / "m.onnx"), target).verdict
    assert v.signature == Signature(Kind.MISMATCH, ("y",), "shape")
    assert "[2, 1, 4]" in v.message and "[2, 4]" in v.message
    (out,) = v.to_json()["outputs"]
    assert out["shape"] == [2, 4] and out["target_shape"] == [2, 1, 4]
    assert v.to_json()["signature"] == {"kind": "mismatch", "outputs": ["y"], "detail": "shape"}


def test_outputs_of_the_same_shape_record_it_once_more_in_json(model_file):
    (out,) = check(model_file("small_mlp"), "emulate:fp16").verdict.to_json()["outputs"]
    assert out["target_shape"] == out["shape"] == [1, 4]


def test_string_outputs_compare_by_equality(tmp_path):
    # x[2] (string) -> Identity -> y      (no distance between strings: equal or not)
    model = make([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [2], TensorProto.STRING)],
                 [vi("y", [2], TensorProto.STRING)])
    data_set = tmp_path / "test_data_set_0"
    data_set.mkdir()
    tensor = numpy_helper.from_array(np.array(["a", "bc"], dtype=object), "x")
    (data_set / "input_0.pb").write_bytes(tensor.SerializeToString())
    v = check(save(model, tmp_path / "m.onnx"), "emulate:fp16", options=RunOptions(inputs=os.fspath(data_set))).verdict
    assert v.signature == Signature(Kind.AGREE)


# 7. Engine messages are quoted from their start, never cut inside a word.


def test_reference_failure_quotes_onnxruntime_from_the_start_and_keeps_the_reason(tmp_path):
    # a[A,B] + b[C,D] -> Add (a node with a long name) -> y      (fed [2,3] and [3,2]: no broadcast)
    name = "encoder_block_" + "_".join(["attention_projection"] * 8)
    model = make([helper.make_node("Add", ["a", "b"], ["y"], name=name)],
                 [vi("a", ["A", "B"]), vi("b", ["C", "D"])], [vi("y", ["E", "F"])])
    feeds = write_npz(tmp_path / "feeds.npz", a=np.ones((2, 3), np.float32), b=np.ones((3, 2), np.float32))
    with pytest.raises(ReferenceFailure) as info:
        check(save(model, tmp_path / "m.onnx"), "emulate:fp16", options=RunOptions(inputs=feeds))
    message = info.value.message
    assert message.startswith("the reference (ort) fails on this model: build-error: onnxruntime failed to run")
    assert "broadcast" in message  # the reason, at the end of onnxruntime's line, is kept
    assert len(message) < 400


def test_quote_message_cuts_only_between_words():
    long = "Exception: " + " ".join(f"word{i}" for i in range(200)) + " the reason"
    quoted = quote_message(long, limit=120)
    assert len(quoted) <= 120
    assert quoted.startswith("Exception: word0") and quoted.endswith("the reason")
    words = set(long.split())
    assert all(token in words for token in quoted.split() if token != "…")
    # OpenVINO's shape: an introducing first line, the reason on the last
    ov = "could not compile: Exception from core.cpp:117:\nCheck 'x' failed at node.cpp:108:\nUnexpected: no dynamic rank"
    assert quote_message(ov) == "could not compile: Exception from core.cpp:117: … Unexpected: no dynamic rank"


def test_worker_traceback_reaches_debug_output_not_the_hint():
    from reprokit.engine.oracle import _raise_for_environment
    from reprokit.engine.worker import WorkerResult

    # The worker's side of an internal error, as result.json carries it (plumbing, no engine).
    result = WorkerResult("error", message="internal error in the engine worker: ValueError: x",
                          hint="rerun with --debug and report the traceback",
                          log="Traceback (most recent call last):\n  ...\nValueError: x\n", exit_code=70)
    with pytest.raises(ReprokitError) as info:
        _raise_for_environment(result, "target")
    assert info.value.exit_code == ExitCode.INTERNAL
    assert "Traceback" not in info.value.hint
    assert "Traceback (most recent call last)" in str(info.value.__cause__)



@pytest.mark.parametrize("elem,dtype_name", [(TensorProto.BFLOAT16, "bfloat16"),
                                              (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
                                              (TensorProto.INT4, "int4"), (TensorProto.INT2, "int2")])
def test_narrow_float_feeds_from_a_test_data_set_reach_onnxruntime_as_themselves(tmp_path, elem, dtype_name):
    """test_cast_BFLOAT16_to_FLOAT's shape: x (bfloat16 / float8) → Cast → y (float), and back
    → z (the narrow type). The feed travels as the real narrow type (not void bytes) to the
    reference and the target, and the narrow output comes back comparable: exit 0, not 5."""
    import ml_dtypes

    model = opset_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT),
                         helper.make_node("Cast", ["y"], ["z"], to=elem)],
                        [helper.make_tensor_value_info("x", elem, [2, 3])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("z", elem, [2, 3])],
                        opsets=(("", 25 if elem == TensorProto.INT2 else 21),))
    path = str(tmp_path / "cast.onnx")
    onnx.save(model, path)
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    values = {TensorProto.INT4: [[1, -2, 3], [-8, 7, 0]], TensorProto.INT2: [[1, -2, 0], [-1, 1, 0]]}.get(
        elem, [[1.5, -2.25, 0.5], [3.0, 0.125, -1.0]])
    x = np.array(values, dtype=getattr(ml_dtypes, dtype_name))
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    result = check(path, "ort:opt", options=RunOptions(inputs=str(data)))
    assert result.verdict.kind is Kind.AGREE
    assert str(np.asarray(result.prepared.feeds.arrays["x"]).dtype) == dtype_name
    assert np.array_equal(np.asarray(result.reference_outputs["y"]), x.astype(np.float32))
    assert str(np.asarray(result.target_outputs["z"]).dtype) == dtype_name


def test_layerwise_names_the_node_where_nan_or_inf_is_born_first(tmp_path):
    """PP-OCRv4 rec's shape: a mismatch starts early (a cancellation after an fp16 rounding, then
    Clips carry it), and the Inf is born later in a Mul whose inputs already mismatch but are
    finite. The first rows name the Mul — the node shrink finds — before the cancellation."""
    # x[2,8] -> Add(2049.3) -> Sub(2048) -> Clip(0, 3000) -> Clip -> Mul(6e4) -> Sub(self) -> y
    model = opset_model(
        [helper.make_node("Add", ["x", "shift"], ["a"], name="add"),
         helper.make_node("Sub", ["a", "unshift"], ["d"], name="cancel"),
         helper.make_node("Clip", ["d", "lo", "hi"], ["c1"], name="clip1"),
         helper.make_node("Clip", ["c1", "lo", "hi"], ["c2"], name="clip2"),
         helper.make_node("Mul", ["c2", "big"], ["m"], name="mul"),
         helper.make_node("Sub", ["m", "m"], ["y"], name="sub")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.array(2049.3, np.float32), "shift"),
         numpy_helper.from_array(np.array(2048.0, np.float32), "unshift"),
         numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
         numpy_helper.from_array(np.array(3000.0, np.float32), "hi"),
         numpy_helper.from_array(np.array(6e4, np.float32), "big")])
    path = str(tmp_path / "born.onnx")
    onnx.save(model, path)
    result = check(path, "emulate:fp16", layerwise=True)
    assert result.verdict.kind is Kind.NONFINITE
    first = result.layerwise.first
    assert first[0].node == "mul" and first[0].error.nonfinite_in_target_only
    assert not first[0].inputs_agree  # the old rule (inputs agree) never named it
    assert "cancel" in [r.node for r in first]  # where the mismatch starts is still listed


def test_backends_says_which_openvino_precisions_work_on_this_cpu(openvino):
    """`backends` said "yes" for OpenVINO on a CPU where its default precision (bf16) is refused:
    it now lists the precisions this CPU takes, from OpenVINO's own capability list."""
    import json
    import subprocess

    from conftest import reprokit_exe

    out = subprocess.run([reprokit_exe(), "backends", "--json"], capture_output=True, text=True, timeout=120)
    import openvino as ov

    row = next(b for b in json.loads(out.stdout)["backends"] if b["engine"] == "openvino")
    caps = list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    text = row["detail"]
    assert "precisions here: f32" in text
    assert ("bf16" in text.split("precisions here:")[1].split(";")[0].split("(")[0]) == ("BF16" in caps)


def test_shrink_takes_an_int4_feed_it_does_not_reduce(tmp_path, cli):
    """test_castlike_FLOAT16_to_INT4_expanded's shape (corpus sweep, shrink exit 70: the feeds'
    digest could not read ml_dtypes' int4 as a buffer): x (float) and like (int4[0], CastLike's
    type donor) from a test_data_set; x also overflows fp16 through a Mul. shrink runs to the
    Mul instead of stopping with an internal error."""
    import ml_dtypes

    big = numpy_helper.from_array(np.array(6e4, np.float32), "big")
    model = opset_model([helper.make_node("CastLike", ["x", "like"], ["q"]),
                         helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
                         helper.make_node("Mul", ["x", "big"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("like", TensorProto.INT4, [0])],
                        [helper.make_tensor_value_info("qf", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                        [big], opsets=(("", 21),))
    path = str(tmp_path / "castlike_int4.onnx")
    onnx.save(model, path)
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    like = np.zeros(0, ml_dtypes.int4)
    (data / "input_1.pb").write_bytes(numpy_helper.from_array(like, "like").SerializeToString())
    out = tmp_path / "out"
    proc = cli("shrink", path, "--target", "emulate:fp16", "--inputs", str(data), "-o", str(out), "--no-pack")
    assert proc.returncode == 0, proc.stderr
    minimal = onnx.load(str(out / "minimal.onnx"))
    assert [n.op_type for n in minimal.graph.node] == ["Mul"]


@pytest.mark.parametrize("elem,dtype_name", [(TensorProto.INT4, "int4"), (TensorProto.UINT4, "uint4"),
                                              (TensorProto.BFLOAT16, "bfloat16")])
def test_openvino_reads_and_takes_narrow_types_as_themselves(tmp_path, openvino, elem, dtype_name):
    """test_cast_FLOAT_to_INT4 / test_cast_INT4_to_FLOAT / test_cast_FLOAT_to_BFLOAT16's shapes
    (corpus sweep): OpenVINO's Tensor.data is the packed bytes of a 4-bit tensor (shape [3] for
    [2, 3]) and bf16 viewed as float16, and an int4 feed did not bind ("could not broadcast"):
    false mismatches and build errors. x (narrow) → Cast → y (float); y → Cast → z (narrow)."""
    import ml_dtypes

    model = opset_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT),
                         helper.make_node("Cast", ["y"], ["z"], to=elem)],
                        [helper.make_tensor_value_info("x", elem, [2, 3])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("z", elem, [2, 3])], opsets=(("", 21),))
    path = str(tmp_path / "cast.onnx")
    onnx.save(model, path)
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    values = {TensorProto.INT4: [[1, -2, 3], [-8, 7, 0]], TensorProto.UINT4: [[1, 2, 15], [8, 7, 0]]}.get(
        elem, [[1.5, -2.25, 0.5], [3.0, 0.125, -1.0]])
    x = np.array(values, dtype=getattr(ml_dtypes, dtype_name))
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    result = check(path, "openvino:f32", options=RunOptions(inputs=str(data)))
    assert result.verdict.kind is Kind.AGREE, result.verdict
    z = np.asarray(result.target_outputs["z"])
    assert str(z.dtype) == dtype_name and z.shape == (2, 3)
    assert np.array_equal(z.astype(np.float32), x.astype(np.float32))
