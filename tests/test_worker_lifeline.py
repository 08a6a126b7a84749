"""An engine worker dies with the reprokit that started it (engine/lifeline.py): a reprokit
killed outright (SIGKILL: the OOM killer, a CI timeout) left its worker looping on a model that
never ends, a core busy with no one left to enforce --timeout (found by a user's trial: the
worker, reparented to pid 1, ran on at ~50% CPU). Real CLI, real onnxruntime worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import onnx
import pytest

from tests.test_qa_new_verify import endless_loop

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)


def _workers_under(folder: str) -> list[int]:
    """Pids of reprokit engine workers whose job lies under ``folder``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if b"reprokit.engine.worker" in argv and any(folder.encode() in a for a in argv):
            found.append(int(pid))
    return found


def test_a_worker_dies_with_a_reprokit_killed_outright(tmp_path):
    model = tmp_path / "endless.onnx"
    onnx.save(endless_loop(), model)
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the worker's job folder lies under tmp_path
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reprokit",
            "check",
            str(model),
            "--target",
            "emulate:fp16",
            "--timeout",
            "600",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while not workers and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _workers_under(str(tmp_path))
        assert workers, "no engine worker started within 120 s"
        time.sleep(1.0)  # the worker is inside onnxruntime's endless Loop by now
        assert _workers_under(str(tmp_path)) == workers
        proc.kill()  # SIGKILL: no handler, no cleanup of reprokit's own
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _workers_under(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _workers_under(str(tmp_path))
        for pid in left:  # never leave a spinning process behind, whatever the assertion says
            os.kill(pid, signal.SIGKILL)
        assert not left, f"engine workers {left} outlived their killed reprokit"
    finally:
        if proc.poll() is None:
            proc.kill()
