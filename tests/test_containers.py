"""Sequence, optional and string inputs and outputs (issues 20 and 13): loaded from ONNX
test_data_set folders (SequenceProto, OptionalProto) and .npz (``name[i]`` members, never a
pickle), fed to onnxruntime-based engines, compared element by element (each tensor of a
sequence with its own shape, strings by equality), and refused with a clean exit 3 by engines
that take tensors only."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.standalone.arrays import load_npz, save_npz

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _save(model, folder, feeds: dict) -> tuple[str, str]:
    """model.onnx and test_data_set_0/ with one proto per input (Tensor/Sequence/Optional)."""
    os.makedirs(folder / "test_data_set_0", exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    for index, (name, value) in enumerate(feeds.items()):
        if isinstance(value, list):
            proto = numpy_helper.from_list(value, name)
        else:
            proto = numpy_helper.from_array(value, name)
        (folder / "test_data_set_0" / f"input_{index}.pb").write_bytes(proto.SerializeToString())
    return str(folder / "model.onnx"), str(folder / "test_data_set_0")


def concat_sequence() -> onnx.ModelProto:
    # s: seq(tensor(float)) ─ConcatFromSequence(axis 0)─▶ y
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], "g", [seq],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def ragged_split() -> onnx.ModelProto:
    # x[3,6] ─SplitToSequence(split [1, 2])─▶ seq of a 1x6 and a 2x6 tensor
    graph = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 2], np.int64), "split")])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_sequence_input_from_a_test_data_set_and_from_npz(tmp_path):
    parts = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((1, 3), np.float32)]
    model, data = _save(concat_sequence(), tmp_path, {"s": parts})
    proc = run_cli("check", model, "--inputs", data, "--target", "emulate:fp16", "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["feeds"]["inputs"]["s"]["shape"] == [[2, 3], [1, 3]]
    np.savez(tmp_path / "feeds.npz", **{"s[0]": parts[0], "s[1]": parts[1]})  # plain numpy, no pickle
    proc = run_cli("check", model, "--inputs", str(tmp_path / "feeds.npz"), "--target", "emulate:fp16")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("check", model, "--inputs", data, "--target", "openvino:f32")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 3 and lines[-2].startswith("Error: input 's' is a sequence") and lines[-1].startswith("Hint:")


def test_ragged_sequence_output_is_compared_tensor_by_tensor(tmp_path):
    model, data = _save(ragged_split(), tmp_path, {"x": np.arange(18, dtype=np.float32).reshape(3, 6)})
    proc = run_cli("check", model, "--inputs", data, "--target", "emulate:fp16", "--json")
    assert proc.returncode == 0, proc.stderr
    outputs = {o["name"]: o["shape"] for o in json.loads(proc.stdout)["verdict"]["outputs"]}
    assert outputs == {"seq[0]": [1, 6], "seq[1]": [2, 6]}


def test_string_input_model_from_the_onnx_wheel(tmp_path):
    folder = os.path.join(ONNX_DATA, "simple", "test_strnorm_model_nostopwords_nochangecase")
    if not os.path.isdir(folder):
        pytest.skip("this onnx wheel ships no StringNormalizer test model")
    proc = run_cli("check", os.path.join(folder, "model.onnx"), "--inputs", os.path.join(folder, "test_data_set_0"),
                   "--target", "emulate:fp16", "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    saved = load_npz(str(tmp_path / "out" / "target_outputs.npz"))
    assert saved["y"].dtype == object and all(isinstance(v, str) for v in saved["y"].flat)


@pytest.mark.slow
def test_a_string_model_an_engine_refuses_shrinks_packs_and_verifies(tmp_path):
    """OpenVINO cannot convert StringNormalizer: a build error to report. The archive holds the
    string feeds in inputs.npz only (polygraphy's inputs.json and trtexec's .bin take numbers)."""
    pytest.importorskip("openvino", reason="OpenVINO not installed")
    folder = os.path.join(ONNX_DATA, "simple", "test_strnorm_model_nostopwords_nochangecase")
    if not os.path.isdir(folder):
        pytest.skip("this onnx wheel ships no StringNormalizer test model")
    out = tmp_path / "out"
    proc = run_cli("shrink", os.path.join(folder, "model.onnx"), "--inputs", os.path.join(folder, "test_data_set_0"),
                   "--target", "openvino:f32", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["signature"]["kind"] == "build-error"
    verify = run_cli("verify", str(out / "report.tar.gz"))
    assert verify.returncode == 1 and "REPRODUCES" in verify.stdout, verify.stdout + verify.stderr


def test_npz_round_trip_of_sequences_optionals_and_strings(tmp_path):
    feeds = {"s": [np.ones((2, 3), np.float32), np.zeros(4, np.int64)], "e": [], "o": None,
             "t": np.array(["a", "bé"], dtype=object), "x[0]": np.arange(3)}
    back = load_npz(save_npz(str(tmp_path / "f.npz"), feeds))
    assert list(back) == list(feeds)
    assert [a.shape for a in back["s"]] == [(2, 3), (4,)] and back["e"] == [] and back["o"] is None
    assert back["t"].tolist() == ["a", "bé"] and back["x[0]"].tolist() == [0, 1, 2]
    with np.load(tmp_path / "f.npz", allow_pickle=False) as plain:  # still a plain numpy .npz
        assert set(plain.files) == {"s[0]", "s[1]", "e[]", "o", "t", "x[0]"}
