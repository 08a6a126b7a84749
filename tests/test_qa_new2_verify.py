"""``reprokit verify --help`` names the exit codes a plain verify gives, as docs/exit-codes.md does:
1 reproduces, 0 the outputs agree, 12 it fails here but not as recorded. The help said
'Exit 1 yes, 0 no.' after exit 12 (DIVERGES_DIFFERENTLY) came: a user reading it took 12 for a
crash. The run below is real: x[1,16] -> Add(1e5) -> Sub(1e5) -> y, shrunk under emulate:bf16
(1e5's spacing 512 loses x: a mismatch in y, the Sub alone kept), verified under emulate:fp16 (1e5 is inf there)."""

from __future__ import annotations

import json

import numpy as np
from conftest import run_cli

from tests.models import cancellation, save


def test_verify_help_names_the_code_of_a_failure_that_is_not_the_recorded_one(tmp_path):
    help_text = " ".join(run_cli("verify", "--help").stdout.split())
    assert "Exit 1 yes, 0 no (the outputs agree), 12 it fails here but not as recorded" in help_text
    save(cancellation(1e5), tmp_path / "m.onnx")
    np.savez(
        tmp_path / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32)
    )
    packed = run_cli(
        "shrink",
        "m.onnx",
        "--inputs",
        "in.npz",
        "--target",
        "emulate:bf16",
        "-o",
        "out",
        cwd=tmp_path,
        timeout=300,
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    other = run_cli(
        "verify", "out/report.tar.gz", "--target", "emulate:fp16", "--json", cwd=tmp_path
    )
    assert other.returncode == 12, other.stdout + other.stderr  # what the help says 12 means
    payload = json.loads(other.stdout)
    assert payload["outcome"] == "diverges differently"
    assert payload["recorded"]["signature"]["kind"] == "mismatch"
    assert payload["verdict"]["signature"]["kind"] == "nonfinite"
