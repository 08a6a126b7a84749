"""The ``reprokit`` command as a user runs it (a real subprocess): exact exit codes, exactly one
``Error:`` and one ``Hint:`` line per bad input, no traceback unless --debug, the user's files
unchanged; ``check --json``, ``--layerwise``, ``-o DIR``, ``backends --json``; and a real
third-party model (PP-OCRv4 detection) under OpenVINO bf16."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import models
import numpy as np
import pytest
from conftest import (
    PY,
    assert_user_error,
    pid_gone,
    reprokit_exe,
    run_cli,
    sha_tree,
)


def strict_json(text: str):
    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token} in --json output")

    return json.loads(text, parse_constant=reject)


@pytest.fixture
def user_dir(tmp_path):
    """A user's working folder with good and bad models and feeds."""
    d = tmp_path / "user"
    d.mkdir()
    models.save(models.small_mlp(), d / "mlp.onnx")
    models.save(models.dynamic_relu(), d / "dyn.onnx")
    models.save(models.log_model(), d / "log.onnx")
    models.save(models.cancellation(), d / "cancel.onnx")
    data = (d / "mlp.onnx").read_bytes()
    (d / "truncated.onnx").write_bytes(data[: len(data) // 2])
    (d / "empty.onnx").write_bytes(b"")
    models.save_external(models.big_weights(), d / "ext.onnx", "ext.weights")
    os.rename(d / "ext.weights", d / "ext.weights.moved")  # the model's weights went missing
    np.savez(d / "wrong_name.npz", z=np.zeros((1, 8), np.float32))
    np.savez(d / "pickled.npz", x=np.array([{"a": 1}], dtype=object))
    return d


ERROR_CASES = {
    "corrupt": (
        ["check", "truncated.onnx", "-t", "emulate:fp16"],
        3,
        None,
        "Error: cannot read truncated.onnx as an ONNX model (",
    ),
    "empty": (
        ["check", "empty.onnx", "-t", "emulate:fp16"],
        3,
        "model file is empty: empty.onnx",
        None,
    ),
    "missing-model": (
        ["check", "nope.onnx", "-t", "emulate:fp16"],
        3,
        "model file not found: nope.onnx",
        None,
    ),
    "directory": (
        ["check", ".", "-t", "emulate:fp16"],
        3,
        ". is a directory, not an ONNX file",
        None,
    ),
    "missing-external-data": (
        ["check", "ext.onnx", "-t", "emulate:fp16"],
        3,
        None,
        "Error: external data file 'ext.weights' of tensor 'W' is missing",
    ),
    "unknown-engine": (
        ["check", "mlp.onnx", "-t", "foo:fp16"],
        2,
        "unknown engine 'foo' in target spec 'foo:fp16'",
        None,
    ),
    "unknown-option": (
        ["check", "mlp.onnx", "-t", "emulate:fp17"],
        2,
        "unknown option 'fp17' for engine 'emulate'",
        None,
    ),
    "missing-target": (["check", "mlp.onnx"], 2, "Missing option '--target' / '-t'.", None),
    "unknown-cli-option": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--bogus"],
        2,
        None,
        "Error: No such option '--bogus'",
    ),
    "unknown-input-name": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--inputs", "wrong_name.npz"],
        3,
        "the inputs name 'z', which is not an input of the model",
        None,
    ),
    "pickled-inputs": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--inputs", "pickled.npz"],
        3,
        None,
        "Error: pickled.npz holds arrays that need pickling, which reprokit refuses",
    ),
    "inputs-not-found": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--inputs", "no.npz"],
        3,
        "inputs file not found: no.npz",
        None,
    ),
    "shape-contradicts-model": (
        ["check", "dyn.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x4x8x8"],
        3,
        "shape [1, 4, 8, 8] for 'x' contradicts the model's static dim 1 = 3 ([N, 3, H, W])",
        None,
    ),
    "shape-wrong-rank": (
        ["check", "dyn.onnx", "-t", "emulate:fp16", "--input-shapes", "x:[1,3,8]"],
        3,
        "shape [1, 3, 8] for 'x' has rank 3, the model declares rank 4 ([N, 3, H, W])",
        None,
    ),
    "shape-unknown-input": (
        ["check", "dyn.onnx", "-t", "emulate:fp16", "--input-shapes", "y:1x3x8x8"],
        3,
        "--input-shapes names 'y', which is not an input of the model",
        None,
    ),
    "shape-unparseable": (
        ["check", "dyn.onnx", "-t", "emulate:fp16", "--input-shapes", "x"],
        2,
        "cannot parse input shape 'x'",
        None,
    ),
    "val-range-unparseable": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--val-range", "x:[1]"],
        2,
        "cannot parse value range 'x:[1]'",
        None,
    ),
    "fail-regex-without-cmd": (
        ["check", "mlp.onnx", "-t", "emulate:fp16", "--fail-regex", "x"],
        2,
        "--fail-regex applies only to a cmd target",
        None,
    ),
    "check-command-not-found": (
        ["check", "mlp.onnx", "-t", "cmd:no-such-command-xyz {model}"],
        4,
        None,
        "check command not found: 'no-such-command-xyz'",
    ),
    "reference-nan": (
        ["check", "log.onnx", "-t", "emulate:fp16", "--val-range", "x:[-2,-1]"],
        5,
        "the reference (ort) itself gives 8 NaN/Inf values in output 'y'",
        None,
    ),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_input_gives_one_error_one_hint_and_its_exit_code(user_dir, case):
    args, code, exact, contains = ERROR_CASES[case]
    before = sha_tree(user_dir)
    proc = run_cli(*args, cwd=user_dir)
    assert_user_error(proc, code, exact, contains=contains)
    assert sha_tree(user_dir) == before  # nothing changed, nothing added


def test_json_mode_errors_print_only_a_json_error_object(user_dir):
    """Issue 18: scripts reading stdout get one JSON object for a failure too, nothing else."""
    proc = run_cli("check", "truncated.onnx", "-t", "emulate:fp16", "--json", cwd=user_dir)
    error, hint = assert_user_error(proc, 3)
    assert json.loads(proc.stdout) == {"schema": "reprokit.error/1", "error": error.removeprefix("Error: "),
                                       "hint": hint.removeprefix("Hint: "), "exit_code": 3}


def test_debug_shows_the_traceback(user_dir):
    proc = run_cli("--debug", "check", "nope.onnx", "-t", "emulate:fp16", cwd=user_dir)
    assert proc.returncode == 3
    assert "Traceback (most recent call last)" in proc.stderr
    assert "Error: model file not found: nope.onnx" in proc.stderr.splitlines()


def test_missing_tensorrt_is_an_environment_error_saying_what_to_install(user_dir):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here: this test needs a machine without it")
    before = sha_tree(user_dir)
    proc = run_cli("check", "mlp.onnx", "-t", "trt:fp16", cwd=user_dir)
    error, hint = assert_user_error(proc, 4)
    assert "tensorrt" in (error + hint).lower()
    assert "install" in hint.lower()
    assert sha_tree(user_dir) == before


# --- check: verdicts and outputs ---------------------------------------------------------


def test_check_json_agreement_exits_0(user_dir):
    proc = run_cli("check", "mlp.onnx", "-t", "emulate:fp16", "--json", cwd=user_dir)
    assert proc.returncode == 0, proc.stderr
    data = strict_json(proc.stdout)
    assert data["schema"] == "reprokit.check/1"
    assert data["model"] == "mlp.onnx"
    verdict = data["verdict"]
    assert verdict["diverges"] is False
    assert verdict["signature"] == {"kind": "agree", "outputs": [], "detail": ""}
    assert verdict["target"] == "emulate:fp16" and verdict["precision"] == "fp16"
    assert verdict["criterion"]["metric"] == "rel-l2" and verdict["criterion"]["tolerance"] == 0.01
    (out,) = verdict["outputs"]
    assert out["name"] == "y" and out["shape"] == [1, 4]
    assert 0 <= out["rel_l2"] < 0.01 and out["exceeds"] is False
    assert data["feeds"] == {
        "source": "random (seed 0)",
        "inputs": {"x": {"shape": [1, 8], "dtype": "float32"}},
    }
    assert data["layerwise"] is None
    assert proc.stderr == ""  # --json: nothing else to parse around


def test_check_json_divergence_exits_1(user_dir):
    proc = run_cli("check", "cancel.onnx", "-t", "emulate:fp16", "--json", cwd=user_dir)
    assert proc.returncode == 1, proc.stderr
    verdict = strict_json(proc.stdout)["verdict"]
    assert verdict["diverges"] is True
    assert verdict["signature"] == {"kind": "mismatch", "outputs": ["y"], "detail": ""}
    assert verdict["outputs"][0]["rel_l2"] == pytest.approx(1.0)
    assert verdict["outputs"][0]["exceeds"] is True


def test_check_tol_override_exits_0(user_dir):
    proc = run_cli("check", "cancel.onnx", "-t", "emulate:fp16", "--tol", "2", cwd=user_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "criterion  rel-l2 <= 2 per output" in proc.stdout
    assert "AGREES: every output within tolerance" in proc.stdout


def test_check_human_output_for_nonfinite(tmp_path):
    models.save(models.matmul_overflow(), tmp_path / "m.onnx")
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", cwd=tmp_path)
    assert proc.returncode == 1
    assert "DIVERGES: nonfinite (inf) in y" in proc.stdout
    assert "Error:" not in proc.stderr


def test_check_fixed_shapes_and_json_inputs_note(tmp_path):
    from polygraphy.json import save_json

    models.save(models.dynamic_relu(), tmp_path / "dyn.onnx")
    x = np.ones((1, 3, 8, 8), np.float32)
    save_json([{"x": x}, {"x": 2 * x}], str(tmp_path / "inputs.json"))
    proc = run_cli(
        "check",
        "dyn.onnx",
        "-t",
        "emulate:fp16",
        "--input-shapes",
        "x:[1,3,8,8]",
        "--inputs",
        "inputs.json",
        "--sample",
        "1",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    data = strict_json(proc.stdout)
    assert data["feeds"]["inputs"] == {"x": {"shape": [1, 3, 8, 8], "dtype": "float32"}}
    assert "inputs.json has 2 samples; using sample 1 (--sample N picks another)" in data["notes"]


def test_check_layerwise_and_out_dir(tmp_path):
    models.save(models.planted_overflow(), tmp_path / "planted.onnx")
    before = sha_tree(tmp_path)
    proc = run_cli(
        "check", "planted.onnx", "-t", "emulate:fp16", "--layerwise", "-o", "out", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    assert "Layerwise: 4 tensors compared, 3 diverge, 1 where divergence starts" in proc.stdout
    table = proc.stdout.split("first diverging tensors", 1)[1]
    row = next(line for line in table.splitlines() if "boom" in line)
    assert "Mul" in row and "│ b " in row  # node boom, op Mul, tensor b
    # -o DIR: feeds, both engines' outputs and the verdict; .reprokit/owned.json names them as
    # reprokit's (reprokit/files.py), so a second check -o out may rewrite them
    out = tmp_path / "out"
    assert os.listdir(out / ".reprokit") == ["owned.json"]
    assert sorted(os.listdir(out)) == [
        ".reprokit",
        "inputs.npz",
        "reference_outputs.npz",
        "target_outputs.npz",
        "verdict.json",
    ]
    verdict = strict_json((out / "verdict.json").read_text())
    assert verdict["signature"] == {"kind": "nonfinite", "outputs": ["y"], "detail": "inf"}
    with np.load(out / "inputs.npz") as feeds:
        x = feeds["x"]
    np.testing.assert_array_equal(
        x, np.random.default_rng(0).uniform(0, 1, (1, 8)).astype(np.float32)
    )
    with np.load(out / "reference_outputs.npz") as ref, np.load(out / "target_outputs.npz") as tgt:
        np.testing.assert_allclose(
            ref["y"], np.maximum((x + 0.5) * np.float32(1e5) * np.float32(1e-5), 0), rtol=1e-5
        )
        # the weight 1e5 is clamped to 65504 in fp16 (as TensorRT does): inf where x + 0.5 > 1
        a = (x + np.float32(0.5)).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(np.isinf(tgt["y"]), a > 1)
        assert np.isinf(tgt["y"]).any()
    after = sha_tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out" + os.sep)} == before


def test_check_layerwise_json_names_the_planted_node(tmp_path):
    models.save(models.planted_overflow(), tmp_path / "planted.onnx")
    proc = run_cli(
        "check", "planted.onnx", "-t", "emulate:fp16", "--layerwise", "--json", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    layerwise = strict_json(proc.stdout)["layerwise"]
    assert (layerwise["compared"], layerwise["diverging"]) == (4, 3)
    assert [(r["node"], r["op"], r["tensor"]) for r in layerwise["first"]] == [("boom", "Mul", "b")]
    # boom's weight 1e5 is clamped to 65504 in fp16: inf where x + 0.5 > 1 (seed-0 feeds)
    x = np.random.default_rng(0).uniform(0, 1, (1, 8)).astype(np.float32)
    assert layerwise["first"][0]["target_inf"] == int(((x + np.float32(0.5)).astype(np.float16) > 1).sum()) > 0
    assert layerwise["marking_changes_engine"] is False


def test_backends_json_lists_every_engine():
    proc = run_cli("backends", "--json")
    assert proc.returncode == 0, proc.stderr
    data = strict_json(proc.stdout)
    assert data["schema"] == "reprokit.backends/1"
    rows = {row["engine"]: row for row in data["backends"]}
    assert set(rows) == {"ort", "emulate", "openvino", "trt", "cmd"}
    assert rows["ort"]["available"] is True and rows["emulate"]["available"] is True
    assert rows["cmd"]["available"] is True
    assert "fp16" in rows["emulate"]["options"]
    if importlib.util.find_spec("tensorrt") is None:
        assert rows["trt"]["available"] is False and rows["trt"]["install"]


# --- a real third-party model ------------------------------------------------------------


def ppocr_det_model() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(
            "rapidocr_onnxruntime is not installed (pip install rapidocr-onnxruntime==1.4.4)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not in the installed rapidocr_onnxruntime")
    return path


@pytest.mark.slow
def test_ppocr_v4_det_diverges_under_openvino_bf16(ov_bf16, tmp_path):
    model = ppocr_det_model()
    digest = sha_tree(model.parent)
    proc = run_cli(
        "check",
        str(model),
        "-t",
        "openvino:bf16",
        "--input-shapes",
        "x:1x3x320x320",
        "--layerwise",
        "--top",
        "5",
        "-o",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIVERGES: mismatch in sigmoid_0.tmp_0" in proc.stdout
    assert "froze input shapes" in proc.stdout
    assert "first diverging tensors (their inputs still agree)" in proc.stdout
    header = proc.stdout.split("first diverging tensors", 1)[1]
    assert "node" in header and "rel L2" in header
    verdict = strict_json((tmp_path / "out" / "verdict.json").read_text())
    assert verdict["signature"]["kind"] == "mismatch"
    assert verdict["outputs"][0]["rel_l2"] > 0.05 and verdict["outputs"][0]["shape"] == [
        1,
        1,
        320,
        320,
    ]
    assert sha_tree(model.parent) == digest  # the installed package's files are untouched


def test_out_dir_that_is_a_file_is_a_user_error(user_dir):
    (user_dir / "taken").write_text("not a directory\n")
    before = sha_tree(user_dir)
    proc = run_cli("check", "mlp.onnx", "-t", "emulate:fp16", "-o", "taken", cwd=user_dir)
    error, _ = assert_user_error(proc, 2, contains="taken")
    assert "internal error" not in error
    assert sha_tree(user_dir) == before


def test_check_of_external_data_model_leaves_the_user_folder_alone(tmp_path):
    models.save_external(models.big_weights(), tmp_path / "ext.onnx", "ext.weights")
    before = sha_tree(tmp_path)
    proc = run_cli(
        "check", "ext.onnx", "-t", "emulate:fp16", "--input-shapes", "x:1x64", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AGREES" in proc.stdout
    assert sha_tree(tmp_path) == before


# --- interruption ------------------------------------------------------------------------

HANG = """\
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "60"])
with open(sys.argv[1] + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {child.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def interrupt_check(tmp_path, sig):
    """Run check on a hanging cmd target, send ``sig`` to reprokit once the target runs.
    Returns (exit code, stderr, pids of the target's processes still alive)."""
    models.save(models.log_model(), tmp_path / "m.onnx")
    (tmp_path / "hang.py").write_text(HANG)
    pid_file = tmp_path / "pids.txt"
    proc = subprocess.Popen(
        [reprokit_exe(), "check", "m.onnx", "-t", f"cmd:{PY} hang.py {pid_file}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), "the target never started"
        pids = [int(p) for p in pid_file.read_text().split()]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        deadline = time.monotonic() + 5
        while not all(pid_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc.returncode, err, [p for p in pids if not pid_gone(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:  # processes this test started: never leave them behind
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_exits_130_and_kills_the_engine_processes(tmp_path):
    code, err, alive = interrupt_check(tmp_path, signal.SIGINT)
    assert code == 130, err
    assert any(line.startswith("Error: interrupted") for line in err.splitlines())
    assert "Traceback" not in err
    assert alive == []


def test_sigterm_exits_130_and_kills_the_engine_processes(tmp_path):
    code, err, alive = interrupt_check(tmp_path, signal.SIGTERM)
    assert alive == []
    assert code == 130, err


@pytest.mark.parametrize("criterion", [["--metric", "allclose", "--atol", "10", "--rtol", "0"], ["--tol", "0.5"]],
                         ids=["atol", "tol"])
def test_integer_outputs_compare_exactly_whatever_the_tolerance(tmp_path, criterion):
    """Issue 25's loose end 4, decided: no tolerance for integer outputs (a class id or an index
    that moves by one is a different answer). --atol 10 does not hide a Cast that rounds differently."""
    from onnx import TensorProto, helper

    # x[1,64] -> Mul(1000.3) -> p -> Cast(int32) -> y[1,64]: fp16 storage of p moves some ids by 1
    model = models.make([helper.make_node("Mul", ["x", "k"], ["p"], name="mul"),
                         helper.make_node("Cast", ["p"], ["y"], to=TensorProto.INT32, name="cast")],
                        [models.vi("x", [1, 64])], [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 64])],
                        [models.const("k", np.float32(1000.3))])
    models.save(model, tmp_path / "ids.onnx")
    proc = run_cli("check", "ids.onnx", "-t", "emulate:fp16", *criterion, "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    output = json.loads(proc.stdout)["verdict"]["outputs"][0]
    assert output["exceeds"] and output["max_abs"] == 1.0
    assert output["error"] == output["mismatched"] > 0  # the error of an exact output: elements that differ


# Numeric cmd check: onnxruntime's outputs, a Tanh's scaled by 1.5 (a wrong kernel); it refuses a
# Neg whose output nothing reads (an engine that cannot run that node alone).
LONE_NEG_REFUSED = """
import sys
import numpy as np
import onnx
import onnxruntime as ort
model, inputs, outputs = sys.argv[1:4]
m = onnx.load(model)
read = {t for n in m.graph.node for t in n.input}
if any(n.op_type == "Neg" and not set(n.output) & read for n in m.graph.node):
    print("error: a Neg nothing reads is not supported")
    sys.exit(1)
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
wanted = {i.name for i in session.get_inputs()}
results = session.run(None, {k: v for k, v in np.load(inputs).items() if k in wanted})
tanh = {o for n in m.graph.node if n.op_type == "Tanh" for o in n.output}
np.savez(outputs, **{o.name: v * 1.5 if o.name in tanh else v for o, v in zip(session.get_outputs(), results)})
"""


def test_layerwise_start_is_a_node_that_diverges_not_one_the_engine_refused_alone(tmp_path):
    """Found on silero-vad under openvino:bf16: `check --layerwise` said "divergence starts at
    /Mul: it diverges on its own" — OpenVINO had refused to run that Mul alone (a build error),
    while its isolated numbers never diverged; the Mul was not in the first-diverging table."""
    from onnx import helper

    # x[1,4] -> Neg "neg" -> a -> Tanh "tanh" -> y   (the check scales Tanh outputs, refuses a lone Neg)
    models.save(models.make([helper.make_node("Neg", ["x"], ["a"], name="neg"),
                             helper.make_node("Tanh", ["a"], ["y"], name="tanh")],
                            [models.vi("x", [1, 4])], [models.vi("y", [1, 4])]), tmp_path / "m.onnx")
    (tmp_path / "chk.py").write_text(LONE_NEG_REFUSED)
    proc = run_cli("check", "m.onnx", "-t", f"cmd:{PY} chk.py {{model}} {{inputs}} {{outputs}}",
                   "--layerwise", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    start = json.loads(proc.stdout)["layerwise"]["start"]
    assert start["kind"] == "local" and start["node"] == "tanh", start
