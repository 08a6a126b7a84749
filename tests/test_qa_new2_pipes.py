"""A reader that closes reprokit's output early (`reprokit check ... | head -1`, `reprokit shrink ...
2>&1 | head -3`) changes neither what the command does nor its exit code: before, click turned the
first BrokenPipeError into exit 1 — DIVERGES for a model that agrees — and a shrink whose stderr
was closed stopped at its next progress line, its result never written (standalone/streams.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from conftest import extract_data, reprokit_exe, run_cli
from models import make, matmul_overflow, save, vi
from onnx import helper


def _closed(args: list[str], cwd, close: str) -> subprocess.CompletedProcess:
    """Run the console script with ``close`` ("stdout", "stderr" or "both") a pipe whose reader has
    gone before the command writes to it; the other stream is captured."""
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    proc = subprocess.Popen(
        [reprokit_exe(), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kept = None
    for name in ("stdout", "stderr"):
        if close in (name, "both"):
            getattr(proc, name).close()
        else:
            kept = getattr(proc, name)
    said = kept.read() if kept is not None else ""
    proc.wait(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, said, "")


def _relu(tmp_path) -> str:
    # x[1,8] -> Relu -> y : every engine agrees
    model = make(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [1, 8])], [vi("y", [1, 8])]
    )
    return save(model, tmp_path / "relu.onnx")


def test_a_closed_stdout_keeps_the_verdicts_exit_code(tmp_path):
    model = _relu(tmp_path)
    agree = _closed(["check", model, "--target", "ort", "--json"], tmp_path, "stdout")
    assert agree.returncode == 0, agree.stdout  # was 1: 'diverges'
    assert "Traceback" not in agree.stdout
    assert _closed(["backends"], tmp_path, "both").returncode == 0
    overflow = save(
        matmul_overflow(), tmp_path / "m.onnx"
    )  # x[1,16] -> MatMul(3e4) -> y : inf in fp16
    assert (
        _closed(["check", overflow, "--target", "emulate:fp16"], tmp_path, "stdout").returncode == 1
    )


def test_a_shrink_whose_output_is_closed_still_writes_its_result(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y : inf in fp16
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    np.savez(
        tmp_path / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32)
    )
    args = [
        "shrink",
        model,
        "--target",
        "emulate:fp16",
        "--inputs",
        "in.npz",
        "--no-pack",
        "--json",
    ]
    run = _closed([*args, "-o", "out"], tmp_path, "both")
    assert run.returncode == 0  # was 1, the shrink cut short at its first progress line
    with open(tmp_path / "out" / "summary.json") as handle:
        assert json.load(handle)["status"] == "done"
    assert not os.path.exists(tmp_path / "out" / ".reprokit" / "lock")
    python_m = subprocess.run(
        [
            sys.executable,
            "-m",
            "reprokit",
            "check",
            model,
            "--target",
            "emulate:fp16",
            "--inputs",
            "in.npz",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert python_m.returncode == 1, (
        python_m.stderr
    )  # `python -m reprokit` agrees with the console script


def test_an_archives_repro_py_whose_output_is_closed_keeps_its_verdict(tmp_path):
    # packed under emulate:fp16 (the overflow), then its repro.py run with stdout closed at once:
    # under ort it agrees (exit 0), under emulate:fp16 it reproduces (exit 1)
    import tarfile

    model = save(
        matmul_overflow(), tmp_path / "m.onnx"
    )  # x[1,16] -> MatMul(3e4) -> y : inf in fp16
    packed = run_cli("pack", str(model), "--target", "emulate:fp16", "-o", "r.tar.gz", cwd=tmp_path, timeout=600)
    assert packed.returncode == 0, packed.stderr
    with tarfile.open(tmp_path / "r.tar.gz") as archive:
        extract_data(archive, tmp_path / "x")
    (folder,) = (tmp_path / "x").iterdir()
    for target, code in (("ort", 0), ("emulate:fp16", 1)):
        proc = subprocess.Popen(
            [sys.executable, "repro.py", "--target", target],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc.stdout.close()
        said = proc.stderr.read()
        assert proc.wait(timeout=600) == code, (
            said
        )  # ort was 1 ('REPRODUCES') with a BrokenPipeError traceback
        assert "Traceback" not in said


def test_a_command_started_with_its_output_descriptors_closed_keeps_its_code(tmp_path):
    # `reprokit ... >&-`: Python opens no sys.stdout (None); was exit 70 (AttributeError) or 1, a traceback
    model = _relu(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}

    def closed(redirect: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", f'exec "$0" "$@" {redirect}', reprokit_exe(), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    agree = closed(">&-", "check", model, "--target", "ort")
    assert agree.returncode == 0 and "Traceback" not in agree.stderr, agree.stderr
    assert closed(">&-", "backends").returncode == 0
    overflow = save(
        matmul_overflow(), tmp_path / "m.onnx"
    )  # x[1,16] -> MatMul(3e4) -> y : inf in fp16
    shrunk = closed(
        ">&- 2>&-", "shrink", overflow, "--target", "emulate:fp16", "--no-pack", "-o", "out"
    )
    assert shrunk.returncode == 0
    with open(tmp_path / "out" / "summary.json") as handle:
        assert json.load(handle)["status"] == "done"
