"""An output's lock file that is not a file (a FIFO, a folder: left by another tool, or made to
get in the way) is exit 2 naming that path, before any engine runs, never a hang. Found on the
round's merged tree: a FIFO at OUT/.reprokit/lock said "cannot create -o directory OUT: Invalid
argument" (the folder existed; ftruncate on the FIFO failed), a folder there "cannot write -o OUT:
Is a directory"; neither named the lock.
"""

from __future__ import annotations

import os

import pytest
from conftest import assert_user_error, run_cli

SAMPLE = "samples/attention_softmax_nan.onnx"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_that_is_not_a_file_is_named(tmp_path, kind):
    lock = tmp_path / "out" / ".reprokit" / "lock"
    lock.parent.mkdir(parents=True)
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    proc = run_cli(
        "check", SAMPLE, "--target", "emulate:fp16", "-o", str(tmp_path / "out"), timeout=60
    )
    assert_user_error(proc, 2, contains=str(lock))
    assert not (tmp_path / "out" / "verdict.json").exists()


def test_a_fifo_beside_a_packed_archive_is_named(tmp_path):
    lock = tmp_path / ".report.tar.gz.reprokit-lock"
    os.mkfifo(lock)
    proc = run_cli(
        "pack",
        SAMPLE,
        "--target",
        "emulate:fp16",
        "-o",
        str(tmp_path / "report.tar.gz"),
        timeout=60,
    )
    error, hint = assert_user_error(proc, 2, contains=f"{lock} is not a regular file")
    assert "delete it" in hint
    assert not (tmp_path / "report.tar.gz").exists()
