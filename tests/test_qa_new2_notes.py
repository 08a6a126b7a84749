"""shrink says each note once: a degenerate reference's warning (a constant output, whose relative
error means little) is found by the shrink on the original ("warning: …") and by the pack on the
result ("WARNING: …"), and both lines were printed, one under the other.

x[1,16] -> MatMul(3e4) -> y : inf in fp16, and y constant over x's columns."""

from __future__ import annotations

import numpy as np
from conftest import run_cli

from tests.models import matmul_overflow, save


def test_a_warning_the_shrink_and_its_pack_both_find_is_said_once(tmp_path):
    save(matmul_overflow(), tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.full((1, 16), 0.5, np.float32))
    proc = run_cli(
        "shrink",
        "m.onnx",
        "--target",
        "emulate:fp16",
        "--inputs",
        "in.npz",
        "-o",
        "out",
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "reference output 'y' is constant" in line]
    assert len(said) == 1, said  # was 2: 'warning: …' and 'WARNING: …'
