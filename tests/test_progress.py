"""Issue 28, item 8: silence and bookkeeping. summary.json's step seconds account for the whole
run (start-up, capture, every step, the archive) and add up to its wall time; a step that says
nothing for a while still gets a progress line every few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
from conftest import PY, reprokit_exe
from models import matmul_overflow, save


def _timed(argv, cwd):
    """Run the command; (exit code, stdout, [(seconds, stderr line)], wall seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    start = time.monotonic()
    proc = subprocess.Popen([reprokit_exe(), *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    lines = [(time.monotonic() - start, line.rstrip()) for line in proc.stderr]
    stdout = proc.stdout.read()
    proc.wait(timeout=600)
    return proc.returncode, stdout, lines, time.monotonic() - start


def test_summary_step_seconds_add_up_to_the_runs_wall_time(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y : inf in fp16. The default run packs the archive too.
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32))
    code, _, lines, wall = _timed(["shrink", model, "--target", "emulate:fp16", "--inputs", "in.npz",
                                   "-o", "out"], tmp_path)
    assert code == 0, lines
    with open(tmp_path / "out" / "summary.json") as handle:
        summary = json.load(handle)
    steps = {s["step"]: s["seconds"] for s in summary["steps"]}
    total = sum(steps.values())
    # every phase has a step: start-up, capture and the archive were not counted at all before
    assert {"startup", "setup", "capture", "confirm", "final", "pack"} <= set(steps), steps
    assert steps["pack"] > 0 and steps["capture"] > 0, steps
    assert abs(total - summary["wall_s"]) <= 0.05 * summary["wall_s"], (total, summary["wall_s"], steps)
    # ... and wall_s is the process's: from its start to the last write (only the exit is left)
    assert abs(summary["wall_s"] - wall) <= 0.05 * wall, (summary["wall_s"], wall, steps)
    for row in summary["steps"]:
        assert row["engine_seconds"] <= row["seconds"] + 0.01, row  # engine time is part of the step's


def test_a_long_silent_engine_call_still_gets_progress_lines(tmp_path):
    """A check that takes 12 s and prints nothing: the console says every few seconds that the
    step is still running, naming it."""
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(12)\n")
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    code, _, lines, _ = _timed(["check", model, "--target", f"cmd:{PY} {tmp_path / 'slow.py'} {{model}}"], tmp_path)
    assert code == 0, lines
    beats = [text for _, text in lines if "still at it" in text]
    assert len(beats) >= 1, lines
    assert all("running ort and cmd:" in text for text in beats), beats


def test_no_progress_line_follows_the_result(tmp_path):
    """The watcher stops before the result is printed: with --json, stdout is one JSON object
    and stderr has no progress at all."""
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(7)\n")
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    code, stdout, lines, _ = _timed(["check", model, "--target", f"cmd:{PY} {tmp_path / 'slow.py'} {{model}}",
                                     "--json"], tmp_path)
    assert code == 0, lines
    json.loads(stdout)
    assert not [text for _, text in lines if "still at it" in text or "running ort" in text], lines
