"""Issue 18, finding 4: every command reprokit prints for the user works when run literally.

The model diverges only with the feeds' range the user chose (--val-range x:[0,255]: the cube
overflows fp16), so a printed command that drops an option judges something else.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time

import pytest
from conftest import reprokit_exe, run_cli
from models import const, make, save, vi
from onnx import helper

CHAIN = 24


def cube_then_chain():
    # x[1,16] -> Mul(x) -> a -> Mul(x) -> b (x^3 > 65504 for x > 40) -> (Add c_i -> Relu) x CHAIN -> y
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"], name="square"),
             helper.make_node("Mul", ["a", "x"], ["t0"], name="cube")]
    weights = []
    for i in range(CHAIN):
        nodes.append(helper.make_node("Add", [f"t{i}", f"c{i}"], [f"s{i}"], name=f"add{i}"))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"t{i + 1}" if i < CHAIN - 1 else "y"], name=f"relu{i}"))
        weights.append(const(f"c{i}", 0.01 * (i + 1)))
    return make(nodes, [vi("x", [1, 16])], [vi("y", [1, 16])], weights)


def as_argv(printed: str) -> list[str]:
    argv = shlex.split(printed)
    assert argv[0] == "reprokit", printed
    return [reprokit_exe(), *argv[1:]]


@pytest.fixture
def model_path(tmp_path):
    return save(cube_then_chain(), tmp_path / "cube.onnx")


def test_default_range_agrees_so_the_range_matters(model_path, tmp_path):
    assert run_cli("check", model_path, "--target", "emulate:fp16", cwd=tmp_path).returncode == 0
    assert run_cli("check", model_path, "--target", "emulate:fp16", "--val-range", "x:[0,255]",
                   cwd=tmp_path).returncode == 1


def test_interrupted_shrink_resumes_with_the_printed_command_and_rerun_reproduces(model_path, tmp_path):
    out = tmp_path / "out"
    args = ["shrink", "cube.onnx", "--target", "emulate:fp16", "--val-range", "x:[0,255]", "--seed", "3",
            "--no-localize", "--max-calls", "0", "--no-pack", "-o", "out"]
    proc = subprocess.Popen([reprokit_exe(), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    # Interrupted as soon as the run's state exists: the capture, the confirmation and the whole
    # search (seconds of engine calls) are still ahead, so the interrupt always lands mid-run.
    deadline = time.monotonic() + 120
    while not (out / ".reprokit" / "run.json").exists():
        assert proc.poll() is None, f"shrink ended before it could be interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "the journal never grew"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    hint = next(line for line in stderr.splitlines() if line.startswith("Hint: "))
    printed = hint.split("continue with: ", 1)[1]
    assert printed.startswith("reprokit shrink --resume out"), hint
    # the hint says whether a best model is there yet (an early interrupt: none)
    assert ("no best model was written yet" in hint) != (out / "minimal.onnx").exists(), hint

    resumed = subprocess.run(as_argv(printed), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["signature"]["kind"] == "nonfinite"

    # The summary's rerun command judges the original exactly as shrink did: it diverges.
    assert "--val-range" in summary["rerun"] and "--seed 3" in summary["rerun"]
    rerun = subprocess.run(as_argv(summary["rerun"]), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "nonfinite" in rerun.stdout


def test_resume_dir_works_from_another_directory_and_keeps_every_option(model_path, tmp_path):
    """--resume DIR alone, from elsewhere: model, target and options (metric, tolerances,
    timeout, range) come from DIR. A run stopped by its call budget continues to the end."""
    options = ["--target", "emulate:fp16", "--val-range", "x:[0,255]", "--metric", "max-abs", "--tol", "0.5",
               "--timeout", "120", "--no-pack"]
    # 2 = the calls every emulate run makes outside the search: the search itself gets none
    first = run_cli("shrink", "cube.onnx", *options, "--max-calls", "2", "-o", "out", cwd=tmp_path)
    assert first.returncode == 8, first.stderr  # nothing removed: the budget ran out first (issue 24)
    assert "--resume out --max-calls 0" in first.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["budget"]["stopped"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = run_cli("shrink", "--resume", str(tmp_path / "out"), "--max-calls", "0", "--no-pack", cwd=elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "done" and not summary["budget"]["stopped"]
    assert summary["criterion"].startswith("max-abs")
    for option in ("--metric max-abs", "--tol 0.5", "--timeout 120.0", "--val-range"):
        assert option in summary["rerun"], summary["rerun"]


def test_resume_of_a_directory_without_a_run_says_so(tmp_path):
    proc = run_cli("shrink", "--resume", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "no shrink run to continue" in proc.stderr
