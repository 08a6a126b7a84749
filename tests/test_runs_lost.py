"""Issue 37, item 4: no run is lost to a second run, an interrupt or a changed model. A second
``shrink``/``pack`` into an output another command is writing is refused at once (exit 2, naming
the holder) and the first run's result stands; a run killed outright (SIGKILL: no handler runs)
leaves its lock file, which the next run takes over. Every run here is the real command on a
real model; SIGSTOP holds the first run at a known point while the second one starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from conftest import assert_user_error, reprokit_exe, run_cli
from models import matmul_overflow, planted_overflow, save


def start(*args: str, cwd) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    return subprocess.Popen(
        [reprokit_exe(), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def wait_for(proc, ready, what: str, wait: float = 120) -> None:
    deadline = time.monotonic() + wait
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


def test_a_second_shrink_into_a_busy_folder_is_refused_and_the_first_finishes(tmp_path):
    # x[1,8] -> Add -> Mul(1e5) "boom" (inf in fp16) -> Mul -> Relu -> y
    save(planted_overflow(), tmp_path / "planted.onnx")
    args = ("shrink", "planted.onnx", "-t", "emulate:fp16", "--no-pack", "-o", "out")
    first = start(*args, cwd=tmp_path)
    try:
        wait_for(
            first,
            lambda: (tmp_path / "out" / ".reprokit" / "run.json").exists(),
            "the first run's run.json",
        )
        first.send_signal(signal.SIGSTOP)  # held mid-run: the second one starts while it is busy
        second = run_cli(*args, cwd=tmp_path)
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert_user_error(second, 2, contains=f"pid {first.pid}", hint_contains="another -o")
    assert (
        "in use by another reprokit command" in second.stderr
        and "shrink planted.onnx" in second.stderr
    )
    assert first.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "done"
    assert not (tmp_path / "out" / ".reprokit" / "lock").exists()  # released at the end


def test_a_killed_runs_lock_is_taken_over_and_resume_finishes(tmp_path):
    save(planted_overflow(), tmp_path / "planted.onnx")
    first = start(
        "shrink", "planted.onnx", "-t", "emulate:fp16", "--no-pack", "-o", "out", cwd=tmp_path
    )
    lock = tmp_path / "out" / ".reprokit" / "lock"
    try:
        wait_for(
            first,
            lambda: (tmp_path / "out" / ".reprokit" / "run.json").exists(),
            "the first run's run.json",
        )
        first.send_signal(signal.SIGKILL)  # a crash: no handler, no release
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert (
        json.loads(lock.read_text())["pid"] == first.pid
    )  # the dead run's lock file is still there
    resumed = run_cli("shrink", "--resume", "out", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"took over {lock}" in resumed.stderr and f"pid {first.pid}" in resumed.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "done"


def test_a_second_pack_onto_the_same_archive_is_refused(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y: inf in fp16
    save(matmul_overflow(), tmp_path / "model.onnx")
    args = ("pack", "model.onnx", "-t", "emulate:fp16", "-o", "report.tar.gz")
    lock = tmp_path / ".report.tar.gz.reprokit-lock"
    first = start(*args, cwd=tmp_path)
    try:
        wait_for(first, lambda: lock.exists() and lock.stat().st_size > 0, "the first pack's lock")
        first.send_signal(signal.SIGSTOP)
        second = run_cli(*args, cwd=tmp_path)
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert_user_error(second, 2, contains=f"pid {first.pid}")
    assert first.returncode == 0, err[-3000:]
    assert (tmp_path / "report.tar.gz").exists() and not lock.exists()
