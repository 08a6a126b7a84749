"""``verify`` judges "reproduces" by the one rule shrink judged with (``engine/bug.same_failure``),
as the archive's own repro.py does — found in the hnew trial of issue 39's round: a pass/fail
archive (a ``cmd:`` check with ``--fail-regex``), verified with a check that failed *without*
matching the recorded regex, printed "REPRODUCES" and exited 1, while its repro.py said
"DIFFERENT FAILURE" (exit 2): verify compared the failure's kind only, so any build error
"reproduced" any other. A divergence of another kind was printed "DOES NOT REPRODUCE", as if
the target agreed.

Real runs: x[1,16] -> MatMul(3e4) -> Softmax -> y (tests/models.matmul_overflow_softmax: NaN under
emulate:fp16), packed with a check command that fails while the model holds a MatMul.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest
from conftest import extract_data, run_cli

from tests.models import matmul_overflow_softmax, save

PY = sys.executable
# Fails, naming the op, while the model holds a MatMul (what the archive records).
HAS_MATMUL = """
import sys, onnx
if any(n.op_type == "MatMul" for n in onnx.load(sys.argv[1]).graph.node):
    print("FAIL: MatMul present"); sys.exit(1)
"""
# Fails on every model, with other words: a different finding than the recorded one.
OTHER_FAILURE = """
import sys
print("out of workspace"); sys.exit(1)
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("passfail")
    save(matmul_overflow_softmax(), folder / "model.onnx")
    (folder / "has_matmul.py").write_text(HAS_MATMUL)
    (folder / "other.py").write_text(OTHER_FAILURE)
    proc = run_cli(
        "pack",
        "model.onnx",
        "--target",
        f"cmd:{PY} has_matmul.py {{model}}",
        "--fail-regex",
        "FAIL: MatMul",
        "-o",
        "report.tar.gz",
        cwd=folder,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def test_verify_a_failure_that_misses_the_recorded_regex_diverges_differently(packed):
    # old code: "REPRODUCES", exit 1 — the kind (build-error) alone was compared
    proc = run_cli(
        "verify", "report.tar.gz", "--target", f"cmd:{PY} other.py {{model}}", cwd=packed
    )
    assert proc.returncode == 12, proc.stdout + proc.stderr
    assert "DIVERGES DIFFERENTLY" in proc.stdout and "REPRODUCES\n" not in proc.stdout
    assert "recorded   build-error (check failed matching /FAIL: MatMul/)" in proc.stdout
    as_json = run_cli(
        "verify", "report.tar.gz", "--target", f"cmd:{PY} other.py {{model}}", "--json", cwd=packed
    )
    payload = json.loads(as_json.stdout)
    assert (as_json.returncode, payload["reproduces"], payload["outcome"]) == (
        12,
        False,
        "diverges differently",
    )
    # the archive's own repro.py says the same of the same check
    with tarfile.open(packed / "report.tar.gz") as tar:
        extract_data(tar, packed / "x")
    top = next((packed / "x").iterdir())
    repro = subprocess.run(
        [PY, "repro.py", "--target", f"cmd:{PY} {packed / 'other.py'} {{model}}"],
        cwd=top,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert repro.returncode == 2 and "DIFFERENT FAILURE" in repro.stdout, (
        repro.stdout + repro.stderr
    )


def test_verify_the_recorded_check_still_reproduces(packed):
    proc = run_cli(
        "verify", "report.tar.gz", "--target", f"cmd:{PY} has_matmul.py {{model}}", cwd=packed
    )
    assert proc.returncode == 1 and "REPRODUCES" in proc.stdout, proc.stdout + proc.stderr
    payload = json.loads(
        run_cli(
            "verify",
            "report.tar.gz",
            "--target",
            f"cmd:{PY} has_matmul.py {{model}}",
            "--json",
            cwd=packed,
        ).stdout
    )
    assert payload["outcome"] == "reproduces"


def test_verify_a_divergence_of_another_kind_is_not_called_agreement(packed):
    # old code: the emulator's NaN printed "DOES NOT REPRODUCE here with this setting"
    proc = run_cli("verify", "report.tar.gz", "--target", "emulate:fp16", cwd=packed)
    assert proc.returncode == 12, proc.stdout + proc.stderr
    assert "here       nonfinite" in proc.stdout
    assert "DIVERGES DIFFERENTLY" in proc.stdout and "DOES NOT REPRODUCE" not in proc.stdout


def endless_loop(n: int = 16):
    """x[1,n] -> Loop(M=1e12, body: y = y + 1) -> y[1,n]: no answer for hours, in constant memory."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["y_in", "one"], ["y_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1, n]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1, n]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "c", "x"], ["y"], body=body)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [
            numpy_helper.from_array(np.array(10**12, np.int64), "M"),
            numpy_helper.from_array(np.array(True), "c"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_an_archive_cannot_make_verify_wait_past_its_default(tmp_path):
    """A verdict.json recording a `timeout` verdict with ``"timeout": 1e300`` and a model that
    never answers: verify waited for ever (old code; 600 s is its own default)."""
    from conftest import assert_user_error, pack_matmul_softmax
    from test_qa_archives import edited

    (tmp_path / "p").mkdir()
    archive = pack_matmul_softmax(tmp_path / "p").archive
    top = tmp_path / "x"
    with tarfile.open(archive) as tar:
        extract_data(tar, top)
    verdict = json.loads(next(top.iterdir()).joinpath("verdict.json").read_text())
    verdict["signature"] = {"kind": "timeout", "outputs": [], "detail": ""}
    verdict["timeout"] = 1e300
    hostile = edited(
        archive,
        tmp_path,
        {
            "model.onnx": endless_loop().SerializeToString(),
            "verdict.json": json.dumps(verdict).encode(),
        },
    )
    error, hint = assert_user_error(
        run_cli("verify", hostile, timeout=120), 3, contains="records a timeout of 1e+300 s"
    )
    assert "--timeout SECONDS" in hint
