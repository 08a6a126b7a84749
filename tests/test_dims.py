"""Sizes reprokit chooses for dynamic dims that --input-shapes does not give (reprokit/dims.py),
and that every outcome names them: the note of a run that goes on, the Error/Hint of one that
fails (issue 15: YOLOv8n's [batch, 3, height, width] fed 1x3x1x1 failed with no word of it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_user_error, run_cli
from models import const, make, save, vi
from onnx import TensorProto, helper

from reprokit.graph import dims


@pytest.fixture(autouse=True)
def _fresh():
    dims.forget()
    yield
    dims.forget()


@pytest.mark.parametrize("shape, hints, want", [
    (["batch", 3, "height", "width"], {}, (1, 3, 224, 224)),
    (["N", 3, "H", "W"], {}, (1, 3, 224, 224)),
    (["batch", 3, "height", "width"], {"batch": "1", "imgsz": "[320, 320]", "stride": "32"}, (1, 3, 320, 320)),
    (["batch", 3, "height", "width"], {"imgsz": "[480, 640]"}, (1, 3, 480, 640)),
    (["batch", 3, "height", "width"], {"stride": "64"}, (1, 3, 256, 256)),  # 224 rounded up to the stride
    ([None, 3, None, None], {}, (1, 3, 224, 224)),  # unnamed: an NCHW image by its place
    (["batch_size", "sequence_length"], {}, (1, 16)),
    (["batchSize", "numTokens"], {}, (1, 16)),
    (["batch_size", "total_sequence_length"], {}, (1, 32)),  # past + sequence
    (["batch_size", 12, "past_sequence_length", 64], {}, (1, 12, 16, 64)),
    (["unk__7", 5], {}, (1, 5)),
    (["d", 3, "d"], {}, (1, 3, 1)),  # one name, one size
    (["batch", "seq"], {"seq": "77"}, (1, 77)),  # metadata naming the dim itself
])
def test_sizes_by_metadata_name_and_place(shape, hints, want):
    assert dims.choose("x", tuple(shape), hints).dims == want


def test_a_name_keeps_its_size_across_inputs():
    dims.choose("ids", ("batch", "seq_len"))
    assert dims.choose("mask", ("batch", "seq_len")).dims == (1, 16)


def test_note_says_what_and_why():
    note = dims.choose("images", ("batch", 3, "height", "width"), {"batch": "1", "imgsz": "[320, 320]"}).note()
    assert note == ("input 'images' has dynamic dims ['batch', 3, 'height', 'width']; reprokit chose 1x3x320x320 "
                    "(batch=1, height=320, width=320: from the model's metadata (batch, imgsz)); give the sizes "
                    "your model takes with --input-shapes images:1x3x320x320")


def fixed_size_reshape(imgsz: str | None = None):
    """x[N, 3, height, width] ─Reshape([1, 3, 64])─▶ y: runs only where height·width = 64."""
    model = make([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")],
                 [vi("x", ["N", 3, "height", "width"])], [vi("y", [1, 3, 64])],
                 [helper.make_tensor("s", TensorProto.INT64, [3], [1, 3, 64])])
    if imgsz:
        helper.set_model_props(model, {"imgsz": imgsz})
    return model


def test_reference_failing_on_chosen_sizes_names_them(tmp_path):
    save(fixed_size_reshape(), tmp_path / "m.onnx")
    error, hint = assert_user_error(run_cli("check", "m.onnx", "-t", "emulate:fp16", cwd=tmp_path), 5)
    assert error.startswith("Error: the reference (ort) fails on this model"), error
    assert error.endswith("[with the dynamic dims reprokit chose: x 1x3x224x224 for ['N', 3, 'height', 'width']]")
    assert hint.startswith("Hint: the chosen sizes may not fit the model; give the sizes your model takes: "
                           "--input-shapes x:1x3x224x224 (edit the numbers)"), hint
    # the same words for scripts, and from shrink
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", "--json", cwd=tmp_path)
    payload = json.loads(proc.stdout)
    assert payload["exit_code"] == 5 and "--input-shapes x:1x3x224x224" in payload["hint"]
    assert "x 1x3x224x224" in payload["error"]
    _, hint = assert_user_error(run_cli("shrink", "m.onnx", "-t", "emulate:fp16", "-o", "out", cwd=tmp_path), 5)
    assert "--input-shapes x:1x3x224x224" in hint


def test_sizes_given_or_from_metadata_run(tmp_path):
    save(fixed_size_reshape(), tmp_path / "m.onnx")
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x3x8x8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "reprokit chose" not in proc.stdout + proc.stderr
    save(fixed_size_reshape(imgsz="[8, 8]"), tmp_path / "meta.onnx")
    proc = run_cli("check", "meta.onnx", "-t", "emulate:fp16", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["feeds"]["inputs"]["x"]["shape"] == [1, 3, 8, 8]
    assert any("reprokit chose 1x3x8x8" in n and "metadata (imgsz)" in n for n in payload["notes"]), payload["notes"]


def test_other_errors_after_the_choice_name_it_too(tmp_path):
    """A model that does not diverge (shrink exit 6) still says which sizes it ran on."""
    model = make([helper.make_node("Mul", ["x", "k"], ["y"], name="m")], [vi("x", ["N", 3, "H", "W"])],
                 [vi("y", ["N", 3, "H", "W"])], [const("k", np.float32(0.5))])
    save(model, tmp_path / "m.onnx")
    _, hint = assert_user_error(run_cli("shrink", "m.onnx", "-t", "emulate:fp16", "-o", "out", cwd=tmp_path), 6)
    assert hint.endswith("dynamic dims were chosen by reprokit: give the sizes your model takes: "
                         "--input-shapes x:1x3x224x224 (edit the numbers)"), hint


def test_a_hint_naming_several_inputs_pastes_back_as_one_argument(tmp_path):
    """Found on silero-vad (input[batch, sequence], state[2, batch, 128]): the hint printed
    `--input-shapes input:1x16 state:2x1x128`, which the shell passes as two arguments — check read
    the second as a MODEL ("MODEL state:2x1x128 is not a file", hint: "check the paths")."""
    # x[N, 3, height, width] ─Reshape([1, 3, 64])─▶ y;  z[N, K] ─Neg─▶ w
    model = fixed_size_reshape()
    model.graph.node.append(helper.make_node("Neg", ["z"], ["w"], name="n"))
    model.graph.input.append(vi("z", ["N", "K"]))
    model.graph.output.append(vi("w", ["N", "K"]))
    save(model, tmp_path / "m.onnx")
    _, hint = assert_user_error(run_cli("check", "m.onnx", "-t", "emulate:fp16", cwd=tmp_path), 5)
    assert "--input-shapes 'x:1x3x224x224 z:1x1' (edit the numbers)" in hint, hint
    # pasted as printed, with the numbers edited: it runs
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x3x8x8 z:1x1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # pasted unquoted, the second shape is taken for a MODEL: the hint says what happened
    error, hint = assert_user_error(run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x3x8x8",
                                            "z:1x1", cwd=tmp_path), 2)
    assert error == "Error: MODEL z:1x1 is not a file", error
    assert "looks like an input shape" in hint and "--input-shapes 'a:1x3 b:2x4'" in hint, hint


def test_a_reference_failing_on_the_sizes_you_gave_says_they_may_not_fit(tmp_path):
    """Found on nudenet 320n (stride 32 in its metadata) at --input-shapes images:1x3x33x33: the
    reference failed with onnxruntime's "Can't merge shape info … Inferred=3 Declared=4" and a hint
    to try polygraphy, not a word of the shapes the user had just given."""
    save(fixed_size_reshape(), tmp_path / "m.onnx")
    _, hint = assert_user_error(run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x3x8x9",
                                        cwd=tmp_path), 5)
    assert hint.startswith("Hint: the sizes you gave (--input-shapes x:1x3x8x9) may not fit the model (a size "), hint
    assert "polygraphy run" in hint  # the advice it had stays, after
    model = fixed_size_reshape()
    helper.set_model_props(model, {"stride": "32"})
    save(model, tmp_path / "strided.onnx")
    _, hint = assert_user_error(run_cli("check", "strided.onnx", "-t", "emulate:fp16", "--input-shapes",
                                        "x:1x3x8x9", cwd=tmp_path), 5)
    assert "the model's metadata says stride 32" in hint, hint
    # sizes that fit: no such words anywhere
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x3x8x8", cwd=tmp_path)
    assert proc.returncode == 0 and "may not fit" not in proc.stdout + proc.stderr
