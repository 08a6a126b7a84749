"""A ``cmd:`` check that hangs on the bug: shrink must reach the node in about log n calls (no
engine call per node), and the archive's timeout verdict must reproduce — in repro.py and in
``reprokit verify`` — within the run's own ``--timeout``, not hang with it or wait 600 s. One that
crashes on it: the archive's repro.py must say so too.

Found as a new user on a YOLOv8 model (nudenet 320n, 323 nodes) with a check that sleeps when
the model holds a Softmax: the survey judged nodes one per call (timeouts are not packed), spent
the auto budget on the first 20 and ended `nothing-removed`; a fixed survey then crashed packing
the report (the bundled repro.py hung until its 60 s limit, whose bytes output broke the log).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import shrink_models as sm
from conftest import extract_data, run_cli

PY = sys.executable

# Sleeps (past --timeout) whenever the model holds a Sigmoid; one log line per call.
HANG_CHECK = """
import sys, time, onnx
with open({log!r}, "a") as handle:
    handle.write("call\\n")
if any(n.op_type == "Sigmoid" for n in onnx.load(sys.argv[1]).graph.node):
    time.sleep(120)
"""


def test_a_hanging_check_is_shrunk_in_log_calls_and_its_archive_reproduces_the_timeout(tmp_path):
    # x[1,8] -> 40 unary nodes (Neg/Abs/Softsign/Relu), n30 a Sigmoid -> y[1,8]
    sm.save(sm.pair_chain(length=40, first=30, second=99), tmp_path / "chain.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "hang.py", HANG_CHECK.format(log=str(log)))
    target = f"cmd:{PY} {script} {{model}}"
    proc = run_cli("shrink", "chain.onnx", "--target", target, "--timeout", "2",
                   "-o", "out", cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["signature"]["kind"] == "timeout"
    assert summary["minimal"]["ops"] == ["Sigmoid"]
    assert "no answer within --timeout 2 s" in proc.stdout  # the note says what each hang costs
    # every node alone would be 31 calls to reach n30; the conflict search needs about 2·log2(40)
    calls = len(log.read_text().splitlines())
    assert calls <= 20, f"{calls} check calls for one node of 40"

    archive = tmp_path / "out" / "report.tar.gz"
    with tarfile.open(archive) as tar:
        extract_data(tar, tmp_path / "x")
    top = next((tmp_path / "x").iterdir())
    assert json.loads((top / "verdict.json").read_text())["timeout"] == 2.0
    repro = subprocess.run([PY, str(top / "repro.py")], cwd=top, capture_output=True, text=True, timeout=120)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert "REPRODUCES: timeout" in repro.stdout
    # verify gives each call the packing run's 2 s, not its 600 s default (the pytest limit says so)
    verified = run_cli("verify", str(archive), "--target", target, cwd=tmp_path, timeout=120)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "REPRODUCES" in verified.stdout


# Dies by SIGSEGV whenever the model holds a Sigmoid.
CRASH_CHECK = """
import os, signal, sys, onnx
if any(n.op_type == "Sigmoid" for n in onnx.load(sys.argv[1]).graph.node):
    os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_crashing_checks_archive_reproduces_the_crash(tmp_path):
    """Found on nudenet 320n with a check that segfaults on a Resize: shrink kept the Resize
    (crash, SIGSEGV) but the bundled repro.py said "DIFFERENT FAILURE: the target fails here"
    (exit 2): it knew only build errors from a failing check, not a death by a signal."""
    sm.save(sm.pair_chain(length=12, first=7, second=99), tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "crash.py", CRASH_CHECK)
    proc = run_cli("shrink", "chain.onnx", "--target", f"cmd:{PY} {script} {{model}}", "-o", "out", cwd=tmp_path,
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["signature"] == {"kind": "crash", "outputs": [], "detail": "SIGSEGV"}
    assert "did not reproduce" not in proc.stdout + proc.stderr
    with tarfile.open(tmp_path / "out" / "report.tar.gz") as tar:
        extract_data(tar, tmp_path / "x")
    top = next((tmp_path / "x").iterdir())
    repro = subprocess.run([PY, str(top / "repro.py")], cwd=top, capture_output=True, text=True, timeout=120)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert "REPRODUCES: crash (SIGSEGV)" in repro.stdout
