"""The ``reprokit shrink --resume OUT`` commands shrink prints run as printed when OUT has a space
(the hnew trial of issue 39's round): the hints of a run interrupted while packing and of an
OUT that already holds a run printed ``--resume my out``, which the shell splits in two (the
run's own interrupt hint, ``runstate.resume_hint``, quoted it already).

Real runs: x[1,16] -> MatMul(3e4) -> Softmax -> y (tests/models.matmul_overflow_softmax), NaN
under emulate:fp16; each printed command is split by the shell's rules and run as it stands.
"""

from __future__ import annotations

import shlex
import signal
import subprocess

from conftest import assert_user_error, interrupt_when, reprokit_exe, run_cli

from tests.models import matmul_overflow_softmax, save

OUT = "my out"


def printed_command(hint: str) -> list[str]:
    """The reprokit command at the end of a hint, split as a shell splits it."""
    return shlex.split(hint[hint.index("reprokit shrink") :].split(", or ")[0])


def test_the_hint_of_an_output_that_holds_a_run_runs_as_printed(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    args = ("shrink", "model.onnx", "--target", "emulate:fp16", "--seed", "3", "-o", OUT)
    assert run_cli(*args, cwd=tmp_path, timeout=300).returncode == 0
    _, hint = assert_user_error(
        run_cli(*args, cwd=tmp_path), 3, contains="already holds a shrink run"
    )
    # old code: "continue it with --resume my out" (no command to split); now a quoted one
    assert f"--resume {shlex.quote(OUT)}" in hint, hint
    again = run_cli(*shlex.split(f"shrink --resume {shlex.quote(OUT)}"), cwd=tmp_path)
    assert again.returncode == 0 and "holds a finished run" in again.stderr, again.stderr


def test_the_hint_of_a_run_interrupted_while_packing_runs_as_printed(tmp_path):
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    proc = subprocess.Popen(
        [
            reprokit_exe(),
            "shrink",
            "model.onnx",
            "--target",
            "emulate:fp16",
            "--seed",
            "3",
            "-o",
            OUT,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    pending = tmp_path / OUT / ".reprokit" / "after-search.json"
    err = interrupt_when(proc, pending.exists, signal.SIGINT)
    assert proc.returncode == 130, err
    hint = next(line for line in err.splitlines() if line.startswith("Hint: "))
    argv = printed_command(hint)
    # old code: ['reprokit', 'shrink', '--resume', 'my', 'out']
    assert argv == ["reprokit", "shrink", "--resume", OUT], hint
    resumed = run_cli(*argv[1:], cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (tmp_path / OUT / "report.tar.gz").exists()


def test_the_hint_of_a_budget_spent_before_any_removal_runs_as_printed(tmp_path):
    # old code (final.py): "reprokit shrink --resume my out --max-calls 0", which the shell splits
    save(matmul_overflow_softmax(), tmp_path / "model.onnx")
    proc = run_cli("shrink", "model.onnx", "--target", "emulate:fp16", "--seed", "3", "--max-calls", "2",
                   "-o", OUT, cwd=tmp_path, timeout=300)
    _, hint = assert_user_error(proc, 8, contains="no node was removed")
    argv = printed_command(hint)
    assert argv[argv.index("--resume") + 1] == OUT, hint
    again = run_cli(*argv[1:], cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
