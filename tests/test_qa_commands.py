"""commands.sh says what each printed command does. Found here (fails on e970ed4): an OpenVINO
archive printed "polygraphy's comparison of the target against ONNX Runtime" over a second
``python repro.py`` (polygraphy has no OpenVINO runner), and a CPU onnxruntime archive called a
single polygraphy run, which compares nothing and sets no optimization level, a comparison.
Real archive: a MatMul whose large weights cancel after a Sub, packed under OpenVINO bf16.
"""

from __future__ import annotations

import subprocess
import tarfile

import numpy as np
import onnx
import pytest
from conftest import extract_data, run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.spec import parse_target


def _cancelling_matmul() -> onnx.ModelProto:
    """x[1,64] -> MatMul(W ~ 100±1) -> Sub(3200) -> y[1,64]: x near 0.5 makes each sum about
    3200, so bf16's 8-bit mantissa leaves an error of a few units after the Sub (rel-l2 ~0.3)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.uniform(-1, 1, (64, 64)) + 100).astype(np.float32), "w")
    c = numpy_helper.from_array(np.float32(3200), "c")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Sub", ["m", "c"], ["y"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes,
        "cancel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [w, c],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_openvino_archive_prints_no_polygraphy_comparison(tmp_path):
    onnx.save(_cancelling_matmul(), tmp_path / "ov.onnx")
    x = np.full((1, 64), 0.5, np.float32) + np.random.default_rng(0).uniform(-0.01, 0.01, (1, 64))
    np.savez(tmp_path / "in.npz", x=x.astype(np.float32))
    done = run_cli(
        "pack", "ov.onnx", "--inputs", "in.npz", "-t", "openvino:bf16", "-o", "o.tar.gz",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    if done.returncode == 4:
        pytest.skip(f"OpenVINO cannot run bf16 on this CPU: {done.stdout[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(tmp_path / "o.tar.gz") as tar:
        extract_data(tar, tmp_path / "x")
    commands = next((tmp_path / "x").iterdir()) / "commands.sh"
    text = commands.read_text()
    assert "polygraphy's comparison" not in text and "no runner for this engine" in text, text
    assert [line for line in text.splitlines() if line.strip() == "python repro.py"] == [
        "python repro.py"
    ]
    assert subprocess.run(["bash", "-n", str(commands)]).returncode == 0


@pytest.mark.parametrize(
    ("target", "compares"),
    [
        ("ort", False),
        ("ort:opt", False),
        ("openvino:bf16", False),
        ("ort:cuda", True),
        ("emulate:fp16", True),
    ],
)
def test_the_note_marks_exactly_the_lines_that_compare_nothing(target, compares):
    from reprokit.report.describe import polygraphy_note

    assert (polygraphy_note(parse_target(target)) == "") == compares
