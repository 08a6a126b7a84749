"""``trt:*`` targets on a machine without an NVIDIA GPU say so (the hnew trial of issue 39's round):
before, the error said only "TensorRT is not importable here" and its hint "pip install
'reprokit[tensorrt]'" — a user on a laptop or CI runner without a GPU installed gigabytes of
wheels to meet the next error. Now the error names the missing driver and the hint the
CPU stand-in that runs here. Exit 4 (environment), as docs/exit-codes.md says.

Runs the installed ``reprokit`` on the bundled conv + clip sample; skipped where this machine
has an NVIDIA driver or TensorRT (the case is a machine with neither).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli

from reprokit.engine.backends.trt_setup import nvidia_driver_present

SAMPLE = Path(__file__).parent.parent / "samples" / "conv_clip.onnx"
pytestmark = pytest.mark.skipif(
    nvidia_driver_present() or importlib.util.find_spec("tensorrt") is not None,
    reason="this machine has an NVIDIA driver or TensorRT: the GPU-less error cannot show",
)


@pytest.mark.parametrize("target", ["trt", "trt:fp16", "trt:int8"])
def test_trt_without_a_gpu_says_there_is_none_and_what_runs_here(target, tmp_path):
    proc = run_cli(
        "check",
        str(SAMPLE),
        "--target",
        target,
        cwd=tmp_path,
        env={"POLYGRAPHY_USE_TENSORRT_RTX": "0"},
    )
    error, hint = assert_user_error(proc, 4, contains="TensorRT is not importable here")
    assert "no NVIDIA GPU driver" in error and "cannot run here, installed or not" in error
    assert "pip install 'reprokit[tensorrt]'" in hint
    if target == "trt:fp16":
        assert "--target emulate:fp16" in hint
    else:  # TF32 and int8: nothing on the CPU emulates them (tests/test_qa_new2_trt.py)
        assert "no CPU engine emulates TensorRT's" in hint and "--target emulate" not in hint


def test_an_archive_verified_under_trt_without_a_gpu_says_so(tmp_path):
    packed = run_cli(
        "pack",
        str(SAMPLE),
        "--target",
        "emulate:fp16",
        "--inputs",
        str(SAMPLE.with_suffix(".inputs.npz")),
        "-o",
        "r.tar.gz",
        cwd=tmp_path,
        timeout=300,
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    proc = run_cli(
        "verify",
        "r.tar.gz",
        "--target",
        "trt:fp16",
        cwd=tmp_path,
        env={"POLYGRAPHY_USE_TENSORRT_RTX": "0"},
    )
    error, hint = assert_user_error(proc, 4, contains="no NVIDIA GPU driver")
    assert "emulate:fp16" in hint
