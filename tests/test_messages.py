"""Issue 28, item 6: what reprokit says. A multi-line reason is kept (first line on ``Error:``, the
rest indented below it); a check command's words are shown once; piped tables carry no padding;
``--redact`` leaves no path of this machine in any file of the archive; an interrupted command
says what it left on disk, not a stock "results are kept"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
from conftest import PY, assert_user_error, reprokit_exe, run_cli
from models import make, matmul_overflow, save, vi
from onnx import helper


def _relu(tmp_path):
    # x[1,4] -> Relu -> y[1,4]
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [1, 4])], [vi("y", [1, 4])])
    return save(model, tmp_path / "relu.onnx")


def test_a_multi_line_reason_is_kept_indented_below_its_error_line(tmp_path):
    (tmp_path / "bad.tar.gz").write_text("not an archive\n")
    proc = run_cli("verify", str(tmp_path / "bad.tar.gz"))
    error, _ = assert_user_error(proc, 3, contains="not a .tar.gz or .zip")
    lines = proc.stderr.splitlines()
    below = lines[lines.index(error) + 1: lines.index(next(x for x in lines if x.startswith("Hint: ")))]
    # tarfile's reasons per compression method: each on its own indented line, none lost
    assert len(below) >= 3 and all(line.startswith("  ") for line in below), proc.stderr
    assert any("gzip" in line for line in below), proc.stderr


def test_a_multi_line_reason_in_json_keeps_every_line(tmp_path):
    (tmp_path / "bad.tar.gz").write_text("not an archive\n")
    proc = run_cli("verify", str(tmp_path / "bad.tar.gz"), "--json")
    got = json.loads(proc.stdout)
    assert got["exit_code"] == 3 and "\n" in got["error"] and "gzip" in got["error"], got


def test_a_check_commands_words_are_shown_once(tmp_path):
    (tmp_path / "check.py").write_text(
        "import sys\n"
        "print('loading the engine', file=sys.stderr)\n"
        "print('RuntimeError: kernel for op Foo is not supported', file=sys.stderr)\n"
        "sys.exit(3)\n")
    model = _relu(tmp_path)
    proc = run_cli("check", model, "--target", f"cmd:{PY} {tmp_path / 'check.py'} {{model}}", "-o",
                   str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("kernel for op Foo is not supported") == 1, proc.stdout
    assert proc.stdout.count("loading the engine") == 1, proc.stdout
    with open(tmp_path / "out" / "verdict.json") as handle:
        message = json.load(handle)["message"]
    assert message.count("kernel for op Foo is not supported") == 1, message
    assert message.startswith("check command failed (exit code 3): RuntimeError: kernel for op Foo"), message


def test_a_check_command_that_passes_the_original_says_so(tmp_path):
    """Found on silero-vad with a check that crashes on an LSTM kept inside an If: the exit 6
    read "does not diverge under cmd:… (rel-l2 <= 0.0001; )": a tolerance no output was held to."""
    _relu(tmp_path)
    proc = run_cli("shrink", "relu.onnx", "--target", f"cmd:{PY} -c pass", "-o", "out", cwd=tmp_path)
    error, _ = assert_user_error(proc, 6)
    # it is run twice (the original's replay): passing both, it may still fail only sometimes
    assert error == "Error: the check passed on the original twice: it does not fail, or fails only sometimes", error


def test_piped_tables_are_not_padded_to_the_console_width():
    for command in ("backends", "env"):
        proc = run_cli(command)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) > 3, proc.stdout
        padded = [line for line in lines if line != line.rstrip()]
        assert not padded, f"{command}: {len(padded)} lines end in spaces, e.g. {padded[0]!r}"
        assert max(map(len, lines)) <= 200, command


def test_redact_leaves_no_path_of_this_machine_in_any_file_of_the_archive(tmp_path):
    folder = tmp_path / "secret-project"
    folder.mkdir()
    model = save(matmul_overflow(), folder / "m.onnx")
    np.savez(folder / "in.npz", x=np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32))
    archive = tmp_path / "r.tar.gz"
    proc = run_cli("pack", model, "--target", "emulate:fp16", "--inputs", str(folder / "in.npz"), "--redact",
                   "-o", str(archive), cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    private = {sys.prefix, os.path.dirname(sys.executable), str(folder), str(tmp_path), tempfile.gettempdir(),
               os.path.expanduser("~"), os.path.realpath(sys.prefix)} - {"", "/"}
    found = {}
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert any(n.endswith("logs/polygraphy_run_onnxrt.log") for n in names), names
        for member in tar.getmembers():
            if not member.isfile() or member.name.endswith((".npz", ".onnx", ".bin")):
                continue
            text = tar.extractfile(member).read().decode("utf-8", "replace")
            hits = sorted(p for p in private if p in text)
            if hits:
                found[member.name] = hits
    assert not found, found


def _interrupt_audit(tmp_path, out):
    """Start an audit whose target call hangs, SIGTERM it once the call runs; (exit, stderr)."""
    started = tmp_path / "started"
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(started)!r}).write_text('x')\n"
        "time.sleep(120)\n")
    model = _relu(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    proc = subprocess.Popen([reprokit_exe(), "audit", model, "--target", f"cmd:{PY} {tmp_path / 'slow.py'} {{model}}",
                             "-o", str(out)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), "the target call never started"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def test_an_interrupted_audit_says_nothing_was_written_over_an_empty_folder(tmp_path):
    out = tmp_path / "audit"
    code, stderr = _interrupt_audit(tmp_path, out)
    assert code == 130, stderr
    assert "Error: interrupted" in stderr, stderr
    left = [f for r, d, fs in os.walk(out) for f in fs if not os.path.relpath(r, out).startswith(".")]
    assert not left, left
    assert "kept" not in stderr and "nothing was written" in stderr, stderr


def test_an_interrupt_does_not_claim_the_users_own_files_as_results(tmp_path):
    """A file that was in the folder before the run is not "written so far"."""
    out = tmp_path / "audit"
    out.mkdir()
    (out / "my-notes.txt").write_text("mine\n")
    code, stderr = _interrupt_audit(tmp_path, out)
    assert code == 130, stderr
    assert "my-notes.txt" not in stderr and "nothing was written" in stderr, stderr
