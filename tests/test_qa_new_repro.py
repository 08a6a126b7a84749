"""An archive's repro.py gives no verdict on a reference that is NaN, as reprokit does (exit 5
there, "the reference itself fails"): the hnew trial of issue 39's round found repro.py judging
against it — a NaN reference beside a NaN target "agreed" (DOES NOT REPRODUCE, exit 0), and a
NaN in ``reference_outputs.npz`` (what ``--reference recorded`` and ``verify --versions``'s cells
read) likewise, and "REPRODUCES: mismatch" (exit 1) beside a finite target. Now: COULD NOT RUN
HERE, exit 4, nothing compared.

A real archive: tests/models.matmul_overflow_softmax packed under emulate:fp16 (NaN there), its
model or recorded reference then replaced by one whose reference output is NaN.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile

import numpy as np
import onnx
import pytest
from conftest import extract_data, run_cli
from onnx import TensorProto, helper

from tests.models import matmul_overflow_softmax, save

PY = sys.executable


def sqrt_of_negative(n: int = 16) -> onnx.ModelProto:
    """x[1,n] -> Abs -> Neg -> Sqrt -> MatMul(ones[n,4]) -> y[1,4]: NaN on every engine (x != 0)."""
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["n"]),
        helper.make_node("Sqrt", ["n"], ["s"]),
        helper.make_node("MatMul", ["s", "w"], ["y"]),
    ]
    w = onnx.numpy_helper.from_array(np.ones((n, 4), np.float32), "w")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def unpacked(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    packed = run_cli("pack", "model.onnx", "--target", "emulate:fp16", "--seed", "3", cwd=tmp_path)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    with tarfile.open(tmp_path / "report.tar.gz") as tar:
        extract_data(tar, tmp_path / "x")
    return next((tmp_path / "x").iterdir())


def repro(top, *args):
    return subprocess.run(
        [PY, "repro.py", *args], cwd=top, capture_output=True, text=True, timeout=120
    )


def test_repro_py_gives_no_verdict_on_a_nan_reference(unpacked):
    first = repro(unpacked)
    assert first.returncode == 1, first.stdout + first.stderr  # the archive as packed reproduces
    onnx.save(sqrt_of_negative(), unpacked / "model.onnx")
    # old code: reference NaN, target NaN: "DOES NOT REPRODUCE: every output agrees", exit 0
    ran = repro(unpacked)
    assert ran.returncode == 4, ran.stdout + ran.stderr
    assert "the reference (ort) gives NaN in output 'y'" in ran.stdout
    assert "Nothing was compared" in ran.stdout and "REPRODUCE" not in ran.stdout


def test_repro_py_gives_no_verdict_on_a_recorded_nan_reference(unpacked):
    recorded = dict(np.load(unpacked / "reference_outputs.npz"))
    np.savez(
        unpacked / "reference_outputs.npz",
        **{k: np.full_like(v, np.nan) for k, v in recorded.items()},
    )
    # old code: "DOES NOT REPRODUCE: every output agrees", exit 0 (the target's NaN "agreed")
    ran = repro(unpacked, "--reference", "recorded")
    assert ran.returncode == 4, ran.stdout + ran.stderr
    assert "reference_outputs.npz holds NaN" in ran.stdout and "REPRODUCES" not in ran.stdout


def unknown_op(n: int = 16) -> onnx.ModelProto:
    """x[1,n] -> foo.bar::Baz -> y[1,4]: an op no onnxruntime registers (as an opset or op newer
    than the onnxruntime installed), so the reference cannot load the model."""
    graph = helper.make_graph(
        [helper.make_node("Baz", ["x"], ["y"], domain="foo.bar")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("foo.bar", 1)]
    )
    model.ir_version = 8
    return model


def test_repro_py_says_the_reference_cannot_run_not_internal_error(unpacked):
    onnx.save(unknown_op(), unpacked / "model.onnx")
    # old code: a traceback and "INTERNAL ERROR in repro.py: nothing was judged.", exit 70
    ran = repro(unpacked)
    assert ran.returncode == 4, ran.stdout + ran.stderr
    assert "the reference (onnxruntime, CPU fp32) fails on model.onnx here" in ran.stdout
    assert "Traceback" not in ran.stdout + ran.stderr and "INTERNAL ERROR" not in ran.stdout
