"""Issue 18, findings 3, 5 and 8: what a new user meets first. A check that cannot start is an
environment error; output paths are checked before any engine runs; an engine's reason is
shown; zero numbers compared is no "agree"; --json failures still print JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import PY, assert_user_error, run_cli
from models import make, save, vi
from onnx import helper

from reprokit.engine.oracle import normalize_message
from reprokit.standalone.arrays import save_npz


@pytest.fixture
def relu_file(tmp_path):
    # x[N,4] -> Relu -> y[N,4]   (N dynamic)
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", ["N", 4])], [vi("y", ["N", 4])])
    return save(model, tmp_path / "relu.onnx")


@pytest.fixture
def marker(tmp_path):
    """A cmd target that leaves a file behind if it ever runs: proof that no engine was called."""
    (tmp_path / "mark.py").write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('ran')\n")
    mark = tmp_path / "ran.txt"
    return f"cmd:{PY} {tmp_path / 'mark.py'} {mark}", mark


# -- 3. a check that cannot start -------------------------------------------------------------


def test_a_mistyped_check_script_is_an_environment_error(relu_file, tmp_path):
    proc = run_cli("check", relu_file, "--target", "cmd:python nonexist.py {model}", cwd=tmp_path)
    assert_user_error(proc, 4, contains="nonexist.py")
    assert "build-error" not in proc.stdout + proc.stderr


def test_an_interpreter_that_cannot_open_its_script_is_an_environment_error(relu_file, tmp_path):
    """No .py suffix, so only the interpreter's own "can't open file" tells: still exit 4."""
    proc = run_cli("check", relu_file, "--target", f"cmd:{PY} no_such_check {{model}}", cwd=tmp_path)
    assert_user_error(proc, 4, contains="no_such_check")


def test_normalize_message_keeps_apostrophes_inside_words():
    text = "/usr/bin/python3: can't open file '/work/x/nonexist.py': [Errno 2] No such file or directory"
    assert normalize_message(text) == "<path>: can't open file <name>: [Errno N] No such file or directory"
    assert normalize_message("error: the model's input 'x' isn't valid") == \
        "error: the model's input <name> isn't valid"


# -- 5. output paths before any work ----------------------------------------------------------


def test_shrink_out_that_is_a_file_fails_before_any_engine_call(relu_file, tmp_path, marker):
    target, mark = marker
    (tmp_path / "afile").write_text("mine")
    proc = run_cli("shrink", relu_file, "--target", target, "-o", str(tmp_path / "afile"), cwd=tmp_path)
    assert_user_error(proc, 2, contains="afile")
    assert not mark.exists()
    assert (tmp_path / "afile").read_text() == "mine"


def test_pack_out_under_a_file_fails_before_any_engine_call(relu_file, tmp_path, marker):
    target, mark = marker
    (tmp_path / "afile").write_text("mine")
    proc = run_cli("pack", relu_file, "--target", target, "-o", str(tmp_path / "afile" / "x.tar.gz"), cwd=tmp_path)
    assert_user_error(proc, 2, contains="afile")
    assert not mark.exists()
    proc = run_cli("pack", relu_file, "--target", target, "-o", str(tmp_path), cwd=tmp_path)
    assert_user_error(proc, 2, contains="is a directory")
    assert not mark.exists()


# -- 8. the cheap ones ------------------------------------------------------------------------


def test_zero_element_shapes_compare_nothing_and_say_so(relu_file, tmp_path):
    # feeds of zero elements: nothing to compare, and no "agree"
    save_npz(str(tmp_path / "empty.npz"), {"x": np.zeros((0, 4), np.float32)})
    proc = run_cli("check", relu_file, "--target", "emulate:fp16", "--inputs", "empty.npz", cwd=tmp_path)
    assert_user_error(proc, 3, contains="nothing was compared")
    assert "AGREES" not in proc.stdout
    # a 0 in --input-shapes is refused on the command line (issue 28 item 5: dims >= 1)
    proc = run_cli("check", relu_file, "--target", "emulate:fp16", "--input-shapes", "x:0x4", cwd=tmp_path)
    assert_user_error(proc, 2, contains="dimension of 0")


def test_json_failures_print_a_json_error_object(relu_file, tmp_path):
    proc = run_cli("check", str(tmp_path / "missing.onnx"), "--target", "emulate:fp16", "--json", cwd=tmp_path)
    payload = json.loads(proc.stdout)
    assert payload["schema"] == "reprokit.error/1"
    assert payload["exit_code"] == proc.returncode == 3
    assert "missing.onnx" in payload["error"] and payload["hint"]
    proc = run_cli("check", relu_file, "--target", "emulate:fp17", "--json", cwd=tmp_path)
    assert json.loads(proc.stdout)["exit_code"] == proc.returncode == 2


def test_human_output_shows_the_engine_reason_not_only_the_first_line(tmp_path):
    """OpenVINO's first line is "Exception from src/…"; the reason (the op it cannot convert)
    comes lines later."""
    pytest.importorskip("openvino")
    # x[2,2] -> Det -> y[]   (onnxruntime runs it; OpenVINO has no conversion rule for Det)
    model = make([helper.make_node("Det", ["x"], ["y"], name="det")], [vi("x", [2, 2])], [vi("y", [])])
    path = save(model, tmp_path / "det.onnx")
    proc = run_cli("check", path, "--target", "openvino:f32", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Det-17" in proc.stdout, proc.stdout
