"""Shape shrinking: after the node reduction, the minimal model's inputs are halved axis by axis
while the signature holds; a weight of the same size on the same axis is cropped with its input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper


def channel_scale_model() -> onnx.ModelProto:
    """x[1,8,32,32] → Relu → Mul(w[1,8,1,1] = 1e5 per channel) → Neg → y: the Mul overflows fp16
    everywhere (w is clamped to 65504 in fp16, as TensorRT does, and x is 1.5–2); a crop of the
    channel axis crops w with it (w broadcasts over exactly 8 channels)."""
    w = numpy_helper.from_array(np.full((1, 8, 1, 1), 1e5, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Mul", ["r", "w"], ["m"], name="scale"),
         helper.make_node("Neg", ["m"], ["y"], name="neg")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def model_and_feeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    onnx.save(channel_scale_model(), str(folder / "m.onnx"))
    np.savez(folder / "x.npz", x=np.random.default_rng(0).uniform(1.5, 2.0, (1, 8, 32, 32)).astype(np.float32))
    return folder


def _shrink(folder, out, *extra):
    proc = run_cli("shrink", str(folder / "m.onnx"), "--target", "emulate:fp16", "--inputs", str(folder / "x.npz"),
                   "-o", str(out), "--no-pack", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_the_minimal_models_inputs_shrink_while_the_signature_holds(model_and_feeds, tmp_path):
    summary = _shrink(model_and_feeds, tmp_path / "out")
    assert summary["minimal"]["ops"] == ["Mul"]
    assert summary["signature"]["kind"] == "nonfinite"
    shapes = summary["shapes"]
    assert shapes["input_elements_after"] * 16 <= shapes["input_elements_before"], shapes
    (cut,) = summary["minimal"]["inputs"]
    # the per-channel weight moves with the channel axis (issue 24): a window of both, never a
    # broadcast of fewer channels against all eight weights
    minimal = onnx.load(str(tmp_path / "out" / "minimal.onnx"))
    (w,) = [t for t in minimal.graph.initializer if t.name == "w"]
    assert w.dims[1] == cut["shape"][1], (list(w.dims), cut["shape"])
    assert shapes["windows"].get("w", [[0, 1], [0, 8]])[1] == shapes["windows"][cut["name"]][1]
    assert summary["calls"]["target"] <= summary["budget"]["max_calls"]
    # the last word: the minimal model, as written, still shows the signature on its own inputs
    check = run_cli("check", str(tmp_path / "out" / "minimal.onnx"), "--target", "emulate:fp16",
                    "--inputs", str(tmp_path / "out" / "inputs.npz"))
    assert check.returncode == 1 and "nonfinite" in check.stdout.lower() + check.stderr.lower()
    with np.load(tmp_path / "out" / "inputs.npz") as data:
        assert data[cut["name"]].size == shapes["input_elements_after"]


@pytest.mark.slow
def test_no_shrink_shapes_keeps_the_cut_shapes(model_and_feeds, tmp_path):
    summary = _shrink(model_and_feeds, tmp_path / "out", "--no-shrink-shapes")
    assert summary["shapes"] is None
    assert summary["minimal"]["inputs"][0]["shape"] == [1, 8, 32, 32]


def test_a_scalar_output_that_diverges_is_shrunk(tmp_path):
    """Found on silero-vad (16k, op15) once its constants folded: a drift-window member with a
    0-d output crashed the packed judgement (exit 70, "'numpy.float64' object does not support item
    assignment" in references.hotspot, which located the element of largest error in an array)."""
    from reprokit.standalone.arrays import save_npz

    # x[1,16] -> Tanh -> ReduceSum(keepdims=0) -> s (0-d) -> Sub(c = s - 0.003) -> y (0-d): fp16 storage of s cancels
    x = np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 16)
    c = np.float32(np.tanh(x).sum(dtype=np.float32) - 0.003)
    nodes = [helper.make_node("Tanh", ["x"], ["a"], name="tanh"),
             helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Sub", ["s", "c"], ["y"], name="cancel")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [numpy_helper.from_array(c, "c")]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "scalar.onnx")
    save_npz(str(tmp_path / "x.npz"), {"x": x})
    proc = run_cli("shrink", "scalar.onnx", "--inputs", "x.npz", "-t", "emulate:fp16", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["signature"]["kind"] == "mismatch" and summary["minimal"]["ops"] == ["Sub"]
