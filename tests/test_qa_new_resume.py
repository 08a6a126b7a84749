"""``shrink --resume OUT`` of a finished run whose result was removed since (the hnew trial of
issue 39's round): it said "nothing to continue, the result is kept as it is" and exited 0 over
an OUT that held neither minimal.onnx nor report.tar.gz. Now exit 3 naming what is gone; a
finished run whose files are there still says it is finished, exit 0.

A real run: x[1,16] -> MatMul(3e4) -> Softmax -> y (tests/models.matmul_overflow_softmax), NaN
under emulate:fp16, shrunk by the installed ``reprokit``.
"""

from __future__ import annotations

import os

from conftest import assert_user_error, run_cli

from tests.models import matmul_overflow_softmax, save


def test_resume_of_a_finished_run_whose_result_is_gone_says_so(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    args = ("shrink", "model.onnx", "--target", "emulate:fp16", "--seed", "3", "-o", "out")
    first = run_cli(*args, cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_cli("shrink", "--resume", "out", cwd=tmp_path)
    assert again.returncode == 0 and "holds a finished run" in again.stderr, again.stderr
    os.remove(tmp_path / "out" / "minimal.onnx")
    os.remove(tmp_path / "out" / "report.tar.gz")
    # old code: "nothing to continue, the result is kept as it is", exit 0
    error, hint = assert_user_error(
        run_cli("shrink", "--resume", "out", cwd=tmp_path),
        3,
        contains="result is gone: minimal.onnx, report.tar.gz",
    )
    assert "new -o directory" in hint
