"""A new user's odd option values (the hqa trial): NaN tolerances and timeouts, value ranges that
are not finite or do not fit an integer input. Each was a wrong verdict, a hang, a silent wrap
or an internal error (exit 70) before; now one ``Error:``/``Hint:`` and exit 2 before any engine.

Real runs of the installed ``reprokit`` on generated models (diagrams at each builder).
"""

from __future__ import annotations

import onnx
import pytest
from conftest import PY, assert_user_error, run_cli
from onnx import TensorProto, helper

from tests.models import dynamic_relu, make, matmul_overflow, save, vi


def cast_model(elem: int) -> onnx.ModelProto:
    # x[4] (elem) -> Cast(to=float) -> y[4]
    return make(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        [vi("x", [4], elem)],
        [vi("y", [4])],
    )


def test_a_nan_tolerance_is_refused_not_read_as_every_output_diverging(tmp_path):
    # old code: "DIVERGES: mismatch in y", exit 1, on a Relu that agrees under emulate:fp16
    model = save(dynamic_relu(), tmp_path / "relu.onnx")  # x[N,3,H,W] -> Relu -> y
    assert run_cli("check", model, "--target", "emulate:fp16").returncode == 0  # it agrees
    for option in ("--tol", "--atol", "--rtol"):
        assert_user_error(
            run_cli("check", model, "--target", "emulate:fp16", option, "nan"),
            2,
            contains="'nan' is not a number",
        )


def test_a_nan_timeout_is_refused_not_a_wait_for_ever(tmp_path):
    # old code: a check that does not answer was never killed (the run outlived this test's 60 s)
    model = save(matmul_overflow(), tmp_path / "m.onnx")  # x[1,16] -> MatMul(3e4) -> y
    sleeper = f"cmd:{PY} -c 'import time; time.sleep(120)' {{model}}"
    proc = run_cli("check", model, "--target", sleeper, "--timeout", "nan", timeout=60)
    assert_user_error(proc, 2, contains="'nan' is not a number")


@pytest.mark.parametrize("value_range", ["[nan,1]", "[-inf,inf]", "[-1e308,1e308]"])
def test_a_value_range_that_is_not_finite_is_a_usage_error(tmp_path, value_range):
    # old code: "internal error: OverflowError: high - low range exceeds valid bounds" (exit 70)
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    proc = run_cli("check", model, "--target", "emulate:fp16", "--val-range", value_range)
    assert_user_error(proc, 2, contains="is not a finite range of numbers")


@pytest.mark.parametrize(
    "elem, value_range, fits",
    [
        (TensorProto.UINT8, "[0,1000]", "x:[0,255]"),  # old code: exit 0, 300 fed as 44
        (TensorProto.UINT8, "x:[-5,3]", "x:[0,3]"),  # old code: exit 0, -5 fed as 251
        (TensorProto.INT64, "[0,1e30]", "x:[0,9223372036854774784]"),  # old code: exit 70
    ],
)
def test_a_value_range_outside_an_integer_input_is_refused_not_wrapped(
    tmp_path, elem, value_range, fits
):
    model = save(cast_model(elem), tmp_path / "cast.onnx")
    proc = run_cli("check", model, "--target", "emulate:fp16", "--val-range", value_range)
    _, hint = assert_user_error(proc, 2, contains="does not fit input 'x'")
    assert fits in hint
    fitting = run_cli(
        "check", model, "--target", "emulate:fp16", "--val-range", fits.replace("x:", "")
    )
    assert fitting.returncode in (0, 1), fitting.stderr  # the range the hint gives runs
