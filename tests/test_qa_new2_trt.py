"""A ``trt`` target on a machine without an NVIDIA GPU names the CPU stand-in of *its* precision:
the hint said ``--target emulate:fp16`` for every trt target — for ``trt:bf16`` a run of another
precision (fp16 overflows at 65504 where bf16 does not: a verdict about a bug the user does not
have), for ``trt`` (TF32) and ``trt:int8`` an emulation of something TensorRT never ran, and
``fp32-nodes=`` dropped. Now: emulate:bf16 for bf16, the fp32-nodes carried (the printed target
runs as printed), and for TF32/fp32/int8/fp8 the plain fact that nothing here emulates them.

Runs the installed ``reprokit`` on a generated model; skipped where this machine has an NVIDIA
driver or TensorRT (the case is a machine with neither)."""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest
from conftest import assert_user_error, run_cli
from onnx import helper

from reprokit.engine.backends.trt_setup import nvidia_driver_present
from tests.models import matmul_overflow, save

pytestmark = pytest.mark.skipif(
    nvidia_driver_present() or importlib.util.find_spec("tensorrt") is not None,
    reason="this machine has an NVIDIA driver or TensorRT: the GPU-less error cannot show",
)


def _hint(target: str, cwd) -> str:
    proc = run_cli(
        "check", "m.onnx", "--target", target, cwd=cwd, env={"POLYGRAPHY_USE_TENSORRT_RTX": "0"}
    )
    return assert_user_error(proc, 4, contains="no NVIDIA GPU driver")[1]


def _stand_in(hint: str) -> str:
    """The target the hint prints, as a shell reads it."""
    return shlex.split(re.search(r"here, without one, --target ('[^']*'|\S+)", hint).group(1))[0]


def test_the_stand_in_of_a_trt_target_without_a_gpu_has_its_precision(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y  (named "matmul": inf in fp16, finite in bf16)
    model = matmul_overflow()
    assert model.graph.node[0] == helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul")
    save(model, tmp_path / "m.onnx")
    assert _stand_in(_hint("trt:bf16", tmp_path)) == "emulate:bf16"  # was emulate:fp16
    assert _stand_in(_hint("trt:fp16", tmp_path)) == "emulate:fp16"
    kept = _stand_in(_hint("trt:fp16,fp32-nodes=matmul", tmp_path))
    assert kept == "emulate:fp16,fp32-nodes=matmul"  # was emulate:fp16: the kept node lost
    ran = run_cli(
        "check", "m.onnx", "--target", kept, cwd=tmp_path
    )  # runs as printed: the kept MatMul agrees
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for target, words in (("trt", "TF32"), ("trt:no-tf32", "fp32"), ("trt:int8", "int8")):
        hint = _hint(target, tmp_path)
        assert (
            f"no CPU engine emulates TensorRT's {words}" in hint and "--target emulate" not in hint
        ), hint


def test_ort_cuda_without_a_gpu_says_there_is_none_and_what_runs_here(tmp_path):
    # the same machine, onnxruntime's CUDA provider: its hint said only 'pip install onnxruntime-gpu'
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has a CUDA provider: the missing-build error cannot show")
    save(matmul_overflow(), tmp_path / "m.onnx")  # x[1,16] -> MatMul(3e4) -> y
    hint = _hint("ort:cuda,bf16", tmp_path)
    assert "pip install 'reprokit[gpu]'" in hint and _stand_in(hint) == "emulate:bf16"
    assert "no CPU engine emulates onnxruntime-gpu's TF32" in _hint("ort:cuda", tmp_path)
