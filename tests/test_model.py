"""model.py: load errors (missing, empty, truncated, random bytes, directory, external data),
freeze_input_shapes errors, save/load round trip and mark_outputs (run on onnxruntime)."""

from __future__ import annotations

import os

import models
import numpy as np
import onnx
import pytest

from reprokit.errors import ExitCode, InputError
from reprokit.graph.io import load_model, save_model
from reprokit.graph.model import (
    freeze_input_shapes,
    input_infos,
    mark_outputs,
    output_names,
)


def load_error(path) -> InputError:
    with pytest.raises(InputError) as info:
        load_model(str(path))
    assert info.value.exit_code == ExitCode.INPUT
    assert info.value.hint
    return info.value


def test_missing_file(tmp_path):
    err = load_error(tmp_path / "nope.onnx")
    assert err.message == f"model file not found: {tmp_path / 'nope.onnx'}"


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert load_error(path).message == f"model file is empty: {path}"


def test_directory(tmp_path):
    assert load_error(tmp_path).message == f"{tmp_path} is a directory, not an ONNX file"


def test_truncated_file(tmp_path, model_file):
    data = open(model_file("small_mlp"), "rb").read()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    err = load_error(path)
    assert err.message.startswith(f"cannot read {path} as an ONNX model (")
    assert "truncated or not ONNX" in err.hint


@pytest.mark.parametrize(
    "content",
    [
        np.random.default_rng(0).bytes(500),
        b"hello world\n",
        b'{"inputs": [1, 2, 3]}',
        b"\x89PNG\r\n\x1a\n" + bytes(64),
    ],
)
def test_not_onnx_bytes(tmp_path, content):
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    err = load_error(path)
    assert str(path) in err.message


def test_missing_external_data(tmp_path):
    path = models.save_external(models.big_weights(), tmp_path / "ext.onnx", "weights.bin")
    assert input_infos(load_model(path))[0].name == "x"  # complete: loads
    os.remove(tmp_path / "weights.bin")
    err = load_error(path)
    assert err.message == (
        f"external data file 'weights.bin' of tensor 'W' is missing (looked in {tmp_path})"
    )


def test_truncated_external_data(tmp_path):
    path = models.save_external(models.big_weights(), tmp_path / "ext.onnx", "weights.bin")
    weights = tmp_path / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:100])
    err = load_error(path)
    assert err.message == (
        "external data file 'weights.bin' is truncated: tensor 'W' needs 16384 "
        "bytes, the file has 100"
    )


def test_external_data_weights_are_loaded(tmp_path):
    path = models.save_external(models.big_weights(), tmp_path / "ext.onnx")
    loaded = load_model(path)
    expected = models.big_weights()  # onnx.save moved the first copy's weights out in place
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(loaded.graph.initializer[0]),
        onnx.numpy_helper.to_array(expected.graph.initializer[0]),
    )


def test_save_load_round_trip(tmp_path):
    original = models.planted_overflow()
    path = save_model(original, str(tmp_path / "sub" / "m.onnx"))
    assert os.listdir(tmp_path / "sub") == ["m.onnx"]  # no .tmp left behind
    loaded = load_model(path)
    assert loaded.SerializeToString() == original.SerializeToString()
    assert output_names(loaded) == ["y"]
    assert [t for node in loaded.graph.node for t in node.output] == ["a", "b", "c", "y"]
    assert (loaded.graph.node[1].name, loaded.graph.node[1].op_type) == ("boom", "Mul")


def test_input_infos_skip_initializers_listed_as_inputs():
    model = models.small_mlp()
    model.graph.input.append(models.vi("W", [8, 4]))  # old exporters list weights as inputs
    infos = input_infos(model)
    assert [(i.name, i.dtype, i.shape) for i in infos] == [("x", np.dtype("float32"), (1, 8))]


def test_input_infos_dynamic_dims():
    (info,) = input_infos(models.dynamic_relu())
    assert info.shape == ("N", 3, "H", "W") and not info.is_static


def test_freeze_input_shapes_sets_dims():
    frozen = freeze_input_shapes(models.dynamic_relu(), {"x": (2, 3, 5, 7)})
    (info,) = input_infos(frozen)
    assert info.shape == (2, 3, 5, 7) and info.is_static
    assert frozen.ir_version == 8 and frozen.opset_import[0].version == 17


def test_freeze_unknown_input():
    with pytest.raises(InputError) as info:
        freeze_input_shapes(models.dynamic_relu(), {"y": (1, 3, 8, 8)})
    assert info.value.message == "--input-shapes names 'y', which is not an input of the model"
    assert info.value.hint == "model inputs: x"


def test_freeze_wrong_rank():
    with pytest.raises(InputError) as info:
        freeze_input_shapes(models.dynamic_relu(), {"x": (1, 3, 8)})
    assert (
        info.value.message
        == "shape [1, 3, 8] for 'x' has rank 3, the model declares rank 4 ([N, 3, H, W])"
    )
    assert info.value.hint == "give 4 dimensions, e.g. x:1x3x1x1"


def test_freeze_contradicting_static_dim():
    with pytest.raises(InputError) as info:
        freeze_input_shapes(models.dynamic_relu(), {"x": (1, 4, 8, 8)})
    assert info.value.message == (
        "shape [1, 4, 8, 8] for 'x' contradicts the model's static dim 1 = 3 ([N, 3, H, W])"
    )


def test_mark_outputs_adds_typed_outputs_that_onnxruntime_returns(tmp_path):
    import onnxruntime as ort

    marked = mark_outputs(models.planted_overflow(), ["a", "b", "y"])
    assert output_names(marked) == ["y", "a", "b"]  # existing ones are not duplicated
    by_name = {o.name: o for o in marked.graph.output}
    assert by_name["b"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in by_name["b"].type.tensor_type.shape.dim] == [1, 8]
    path = str(tmp_path / "marked.onnx")
    onnx.save(marked, path)
    x = np.full((1, 8), 0.25, np.float32)
    y, a, b = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(a, 0.75)
    np.testing.assert_allclose(b, 75000.0)
    np.testing.assert_allclose(y, 0.75, rtol=1e-6)


def test_mark_outputs_leaves_the_original_alone():
    model = models.planted_overflow()
    before = model.SerializeToString()
    mark_outputs(model, ["a"])
    assert model.SerializeToString() == before
