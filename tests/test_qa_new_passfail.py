"""A check command that cannot import what it needs never looked at the model (the hnew trial of
issue 39's round): a Python check whose traceback ends in ``ModuleNotFoundError`` exits 1, which
polygraphy's rules read as "the model fails" — ``check`` said DIVERGES (exit 1), and an archive's
repro.py, run by a stranger who lacks the module, said REPRODUCES (exit 1) having checked
nothing. Now ``check`` is exit 4 (environment) and repro.py "COULD NOT RUN HERE" (exit 4).

Real runs: x[1,16] -> MatMul(3e4) -> Softmax -> y (tests/models.matmul_overflow_softmax) and a
check script that imports a module (``runner_lib``, a stand-in for the user's TensorRT runner)
and fails while the model holds a MatMul.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

from conftest import assert_user_error, extract_data, run_cli

from tests.models import matmul_overflow_softmax, save

PY = sys.executable
CHECK = """
import sys, onnx
import runner_lib  # the user's own runner: on the packing machine only
if any(n.op_type == "MatMul" for n in onnx.load(sys.argv[1]).graph.node):
    sys.exit(1)
"""


def with_runner_lib(folder) -> dict:
    (folder / "lib").mkdir()
    (folder / "lib" / "runner_lib.py").write_text("")
    paths = [str(folder / "lib"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def test_check_whose_import_fails_is_an_environment_error(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    (tmp_path / "check.py").write_text(CHECK)
    # old code: "DIVERGES: build-error (check command exit code 1)", exit 1
    error, hint = assert_user_error(
        run_cli("check", "model.onnx", "--target", f"cmd:{PY} check.py {{model}}", cwd=tmp_path),
        4,
        contains="could not import 'runner_lib' here",
    )
    assert "install runner_lib" in hint
    found = run_cli(
        "check",
        "model.onnx",
        "--target",
        f"cmd:{PY} check.py {{model}}",
        cwd=tmp_path,
        env=with_runner_lib(tmp_path),
    )
    assert found.returncode == 1 and "DIVERGES" in found.stdout, found.stdout + found.stderr


def test_an_archives_repro_py_without_the_checks_module_cannot_run(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    (tmp_path / "check.py").write_text(CHECK)
    packed = run_cli(
        "pack",
        "model.onnx",
        "--target",
        f"cmd:{PY} check.py {{model}}",
        "-o",
        "r.tar.gz",
        cwd=tmp_path,
        env=with_runner_lib(tmp_path),
        timeout=300,
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        extract_data(tar, tmp_path / "x")
    top = next((tmp_path / "x").iterdir())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a stranger's machine
    ran = subprocess.run(
        [PY, "repro.py"], cwd=top, capture_output=True, text=True, timeout=120, env=env
    )
    # old code: "REPRODUCES: the target fails with the reported message", exit 1
    assert ran.returncode == 4, ran.stdout + ran.stderr
    assert "could not import 'runner_lib' here" in ran.stdout and "REPRODUCES" not in ran.stdout
