"""pack's progress names logs/ files only for an archive that holds them. polygraphy's runs start
before pack's check (report/logs.early_logs); on e970ed4 and hqa's 3b3eb5d their lines
"logs/polygraphy_inspect_model.log: polygraphy inspect model" were printed at once, so a pack that
ended with exit 6 (the model does not diverge: no archive is written) named logs of an archive
that never existed.
"""

from __future__ import annotations

import numpy as np
import onnx
from conftest import run_cli
from onnx import TensorProto, helper


def _relu(root):
    """x[1,8] -> Relu -> y: fp16 rounds x, so it diverges only under a zero tolerance."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), root / "relu.onnx"
    )
    np.savez(root / "in.npz", x=np.linspace(0.1, 3.3, 8, dtype=np.float32)[None])


def test_a_pack_that_writes_no_archive_names_no_logs(tmp_path):
    _relu(tmp_path)
    done = run_cli("pack", "relu.onnx", "--inputs", "in.npz", "--target", "emulate:fp16", "-o", "r.tar.gz",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 6, done.stdout + done.stderr
    assert not (tmp_path / "r.tar.gz").exists()
    out = done.stdout + done.stderr
    assert "logs/" not in out, out
    assert "started beside the check: polygraphy inspect model, run model.onnx" in out, out


def test_a_written_archive_still_names_its_logs(tmp_path):
    _relu(tmp_path)
    done = run_cli("pack", "relu.onnx", "--inputs", "in.npz", "--target", "emulate:fp16", "--tol", "0",
                   "-o", "r.tar.gz", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "logs/polygraphy_run_onnxrt.log: polygraphy run" in out, out
    assert out.index("writing the bundle") < out.index("logs/polygraphy_run_onnxrt.log"), out
