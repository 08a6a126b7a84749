"""Issue 39: the ``reprokit`` console script ends its process as soon as its last file is written
(``cli/app.py``: ``_leave``). The exit handlers still run (the output's lock released, temporary
folders removed), both streams are flushed and the exit status is kept; only the interpreter's
teardown is skipped — freeing onnx's and onnxruntime's modules, 0.1-0.3 s on a loaded machine,
which came after summary.json's ``wall_s`` was written and so belonged to no step
(tests/test_progress.py's bound, once missed by 6.8%). Where a thread not marked daemon is still
working, the ordinary exit waits for it, as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from conftest import reprokit_exe
from models import matmul_overflow, save

# Run in a fresh interpreter: an object only the interpreter's teardown frees says so when freed;
# an exit handler says so; 100 KB are left in stdout's buffer (a pipe: block-buffered).
_ENDING = """
import atexit, sys, threading, time
from reprokit.cli.app import _leave

class FreedAtTeardown:
    def __del__(self):
        sys.stdout.write("teardown ran\\n")
        sys.stdout.flush()

kept = FreedAtTeardown()
atexit.register(lambda: sys.stdout.write("exit handler ran\\n"))
sys.stdout.write("x" * 100_000 + "\\n")
if "thread" in sys.argv:  # a worker not marked daemon, still at work
    threading.Thread(target=lambda: (time.sleep(1), sys.stdout.write("thread finished\\n"))).start()
{end}
"""


def _ending(end: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _ENDING.format(end=end), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_leave_runs_the_exit_handlers_flushes_and_skips_only_the_teardown():
    ordinary = _ending("sys.exit(3)")  # the control: the teardown frees the object, and says so
    assert ordinary.returncode == 3 and "teardown ran" in ordinary.stdout, ordinary
    left = _ending("_leave(3)")
    assert left.returncode == 3, left
    assert "x" * 100_000 in left.stdout and "exit handler ran" in left.stdout, left.stdout[-200:]
    assert "teardown ran" not in left.stdout, left.stdout[-200:]


def test_leave_waits_for_a_thread_still_at_work_as_the_ordinary_exit_does():
    left = _ending("_leave(0)", "thread")
    assert left.returncode == 0, left
    assert "thread finished" in left.stdout and "exit handler ran" in left.stdout, left.stdout[
        -200:
    ]


def test_the_console_script_keeps_its_output_exit_status_and_cleanup(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y : inf in fp16
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    np.savez(
        tmp_path / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32)
    )
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    run = subprocess.run(
        [
            reprokit_exe(),
            "shrink",
            model,
            "--target",
            "emulate:fp16",
            "--inputs",
            "in.npz",
            "-o",
            "out",
            "--no-pack",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)  # the whole object reached the pipe
    with open(tmp_path / "out" / "summary.json") as handle:
        assert json.load(handle)["wall_s"] == summary["wall_s"]
    assert not os.path.exists(
        tmp_path / "out" / ".reprokit" / "lock"
    )  # released by its exit handler
    check = subprocess.run(
        [reprokit_exe(), "check", model, "--target", "emulate:fp16", "--inputs", "in.npz"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert check.returncode == 1 and "diverge" in (check.stdout + check.stderr).lower(), check
    usage = subprocess.run(
        [reprokit_exe(), "shrink", model],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert usage.returncode == 2 and usage.stderr.startswith("Error:"), usage


def test_a_profiled_run_still_gets_its_profile_written(tmp_path):
    # cProfile (and `coverage run`) write their results when the interpreter ends: such a run
    # gets the ordinary exit
    profile = tmp_path / "run.prof"
    run = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "reprokit", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "reprokit" in run.stdout, run
    assert profile.stat().st_size > 0
