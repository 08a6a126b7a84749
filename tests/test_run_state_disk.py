"""Issue 28, item 7: a shrink run's captured activations (OUT/.reprokit/activations, with the
candidate models and engine-call folders) are removed when the run ends — a result, exit 6
included — and their size is printed; they stay for an interrupted run (``--resume`` needs
them) and with ``--keep-state``. run.json and the journal always stay."""

from __future__ import annotations

import signal
import subprocess
import time

from conftest import PY, reprokit_exe, run_cli
from models import planted_overflow, save, small_mlp

BULKY = ("activations", "models", "calls")


def state(out) -> set[str]:
    return {p.name for p in (out / ".reprokit").iterdir()}


def test_a_finished_run_removes_its_activations_and_says_how_much(tmp_path):
    # x[1,8] -> Add -> Mul(1e5) "boom" (inf in fp16) -> Mul -> Relu -> y
    save(planted_overflow(), tmp_path / "planted.onnx")
    proc = run_cli("shrink", "planted.onnx", "-t", "emulate:fp16", "--no-pack", "-o", "out", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not state(tmp_path / "out") & set(BULKY), state(tmp_path / "out")
    assert {"run.json", "journal.jsonl"} <= state(tmp_path / "out")
    assert "MiB of captured activations and candidates" in proc.stderr and "removed" in proc.stderr


def test_keep_state_keeps_them(tmp_path):
    save(planted_overflow(), tmp_path / "planted.onnx")
    proc = run_cli("shrink", "planted.onnx", "-t", "emulate:fp16", "--no-pack", "--keep-state", "-o", "out",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / ".reprokit" / "activations" / "index.json").exists()
    assert "kept" in proc.stderr and "--keep-state" in proc.stderr


def test_nothing_to_reduce_removes_them_too(tmp_path):
    save(small_mlp(), tmp_path / "mlp.onnx")  # agrees under emulate:fp16: exit 6
    proc = run_cli("shrink", "mlp.onnx", "-t", "emulate:fp16", "-o", "out", cwd=tmp_path, timeout=300)
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert not state(tmp_path / "out") & set(BULKY)


def test_an_interrupted_run_keeps_them_for_resume(tmp_path):
    save(planted_overflow(), tmp_path / "planted.onnx")
    # a check that takes its time: the interrupt lands after the capture, during the confirmation
    (tmp_path / "slow.py").write_text("import sys, time\ntime.sleep(30)\nsys.exit(1)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([reprokit_exe(), "shrink", "planted.onnx", "-t", f"cmd:{PY} slow.py {{model}}",
                             "--no-pack", "-o", "out"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    while not (out / ".reprokit" / "activations" / "index.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the capture never finished"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert (out / ".reprokit" / "activations" / "index.json").exists()
    assert "for --resume" in stderr
