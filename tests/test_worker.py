"""worker.py and the cmd engine: real child processes that crash, abort, hang, fail, write
outputs or flood their output; run directly through ``run_in_worker`` and through
``session.check`` with ``--target 'cmd:...'``."""

from __future__ import annotations

import os
import textwrap
import time

import numpy as np
import pytest
from conftest import PY, pid_gone

from reprokit.api import RunOptions, check
from reprokit.engine.bug import same_failure
from reprokit.engine.oracle import Kind, Signature
from reprokit.engine.worker import run_in_worker

SEGV = f"{PY} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"
ABORT = f"{PY} -c 'import os; os.abort()'"


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.fixture
def log_model(model_file):
    return model_file("log_model")


@pytest.fixture
def feeds_file(tmp_path):
    path = str(tmp_path / "feeds.npz")
    np.savez(path, x=np.linspace(1, 2, 8, dtype=np.float32).reshape(1, 8))
    return path


# --- run_in_worker directly ---------------------------------------------------------------


def test_worker_runs_ort_and_returns_memory_mapped_outputs(log_model, feeds_file, tmp_path):
    result = run_in_worker("ort", log_model, feeds_file, str(tmp_path / "job"))
    assert result.status == "ok", result.message
    y = result.outputs["y"]
    assert isinstance(y, np.memmap)  # big outputs cross through the disk, read back mapped
    expected = np.log(np.linspace(1, 2, 8, dtype=np.float32)).reshape(1, 8)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-6)
    assert result.meta["optimized"] is False


def test_worker_reports_a_segfaulting_command_as_crash(log_model, feeds_file, tmp_path):
    result = run_in_worker("cmd:" + SEGV, log_model, feeds_file, str(tmp_path / "job"))
    assert result.status == "crash"
    assert result.meta["signal"] == "SIGSEGV"
    assert result.message.startswith("check command killed by SIGSEGV")


def test_worker_process_killed_by_a_signal_is_a_crash(log_model, feeds_file, tmp_path):
    """The worker process itself dies (as an engine's segfault would kill it)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('RK_TEST_SEGV_SELF') == '1':\n"
        "    os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    env = {"PYTHONPATH": str(site), "RK_TEST_SEGV_SELF": "1"}
    result = run_in_worker("ort", log_model, feeds_file, str(tmp_path / "job"), env=env)
    assert result.status == "crash"
    assert result.message == "engine process killed by SIGSEGV"


def test_worker_reports_a_bad_spec_as_error_with_its_exit_code(log_model, feeds_file, tmp_path):
    result = run_in_worker("emulate:fp17", log_model, feeds_file, str(tmp_path / "job"))
    assert result.status == "error"
    assert result.exit_code == 2
    assert result.message == "unknown option 'fp17' for engine 'emulate'"


def test_worker_reports_a_missing_command_as_unavailable(log_model, feeds_file, tmp_path):
    result = run_in_worker(
        "cmd:no-such-command-xyz {model}", log_model, feeds_file, str(tmp_path / "job")
    )
    assert result.status == "unavailable"
    assert result.exit_code == 4
    assert "no-such-command-xyz" in result.message


def test_worker_timeout_kills_the_whole_process_group(log_model, feeds_file, tmp_path):
    pid_file = tmp_path / "pids.txt"
    hang = script(
        tmp_path,
        "hang.py",
        """\
        import os, subprocess, sys, time
        child = subprocess.Popen(["sleep", "60"])  # a grandchild: must die with the group
        with open(sys.argv[1], "w") as handle:
            handle.write(f"{os.getpid()} {child.pid}")
        time.sleep(60)
    """,
    )
    start = time.monotonic()
    result = run_in_worker(
        f"cmd:{PY} {hang} {pid_file}", log_model, feeds_file, str(tmp_path / "job"), timeout=2
    )
    elapsed = time.monotonic() - start
    assert result.status == "timeout"
    assert result.message == "no answer within 2 s; the process group was killed"
    assert elapsed < 15
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(pid_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if not pid_gone(p)] == []


def test_a_check_command_is_started_by_reprokit_itself_with_the_call_s_environment(log_model, feeds_file, tmp_path):
    """A check command is a process already: its call needs no worker interpreter of its own
    (issue 39: one costs about what a small check does). The command's parent is this process,
    and it gets the call's environment; a worker process was its parent before."""
    seen = tmp_path / "seen.txt"
    report = script(tmp_path, "report.py", """\
        import os, sys
        with open(sys.argv[1], "w") as handle:
            handle.write(f"{os.getppid()} {os.environ.get('RK_TEST_CALL_ENV')}")
    """)
    result = run_in_worker(f"cmd:{PY} {report} {seen}", log_model, feeds_file, str(tmp_path / "job"),
                           env={"RK_TEST_CALL_ENV": "given"})
    assert result.status == "ok", result.message
    parent, value = seen.read_text().split()
    assert int(parent) == os.getpid() and value == "given"


# --- the cmd engine through session.check -------------------------------------------------


def test_segfaulting_check_command_is_a_crash_verdict(log_model):
    v = check(log_model, "cmd:" + SEGV).verdict
    assert v.signature == Signature(Kind.CRASH, detail="SIGSEGV")
    assert v.diverges and v.outputs == ()


def test_aborting_check_command_is_a_crash_verdict(log_model):
    v = check(log_model, "cmd:" + ABORT).verdict
    assert v.signature == Signature(Kind.CRASH, detail="SIGABRT")


def test_hanging_check_command_times_out(log_model, tmp_path):
    hang = script(tmp_path, "sleep.py", "import time\ntime.sleep(60)\n")
    start = time.monotonic()
    v = check(log_model, f"cmd:{PY} {hang}", options=RunOptions(timeout=2)).verdict
    assert time.monotonic() - start < 15
    assert v.signature == Signature(Kind.TIMEOUT, detail="timeout")


def test_nonzero_exit_is_a_build_error(log_model):
    cmd = f'{PY} -c \'import sys; print("loading"); print("Assertion failed: foo"); sys.exit(3)\''
    v = check(log_model, "cmd:" + cmd).verdict
    assert v.signature.kind is Kind.BUILD_ERROR
    # without --fail-regex the exit status is the failure class (the message stays in the verdict)
    assert v.signature.detail == "check command exit code 3"
    assert v.message.startswith("check command failed (exit code 3): Assertion failed: foo")


def test_fail_regex_match_gives_the_regex_as_signature(log_model):
    cmd = f"{PY} -c 'import sys; print(\"Assertion failed: foo at 0x123\"); sys.exit(3)'"
    v = check(log_model, "cmd:" + cmd, options=RunOptions(fail_regex="Assertion failed")).verdict
    assert v.signature == Signature(
        Kind.BUILD_ERROR, detail="check failed matching /Assertion failed/"
    )
    assert "Assertion failed: foo at 0x123" in v.message


def test_fail_regex_not_matching_is_a_different_failure(log_model):
    cmd = f"{PY} -c 'import sys; print(\"out of memory\"); sys.exit(3)'"
    v = check(log_model, "cmd:" + cmd, options=RunOptions(fail_regex="Assertion failed")).verdict
    assert v.signature.kind is Kind.BUILD_ERROR  # still reported, never silently passing
    assert v.signature.detail != "check failed matching /Assertion failed/"
    assert not same_failure(v.signature,
        Signature(Kind.BUILD_ERROR, detail="check failed matching /Assertion failed/")
    )
    assert "without matching /Assertion failed/" in v.message
    assert "out of memory" in v.message


def _exits(code: int, said: str = "") -> str:
    return f"""cmd:{PY} -c 'import sys; print("{said}"); sys.exit({code})'"""


@pytest.mark.parametrize("code, said, options, kind, detail", [
    # polygraphy's --check rules, one row each
    (2, "", {}, "build-error", "check command exit code 2"),
    (2, "", {"fail_codes": (3,)}, "build-error", "a different finding (exit code N is not a --fail-code (N))"),
    (3, "", {"fail_codes": (3,)}, "build-error", "check command exit code 3"),
    (0, "bad", {"fail_codes": (0,)}, "build-error", "check command exit code 0"),
    (4, "", {"ignore_fail_codes": (4,)}, "agree", ""),
    (0, "REALLY BAD!", {"fail_regex": ("REALLY BAD", "FOUND A BAD NODE")}, "build-error",
     "check failed matching /REALLY BAD/ | /FOUND A BAD NODE/"),
    (1, "FOUND A BAD NODE!", {"fail_regex": ("REALLY BAD", "FOUND A BAD NODE")}, "build-error",
     "check failed matching /REALLY BAD/ | /FOUND A BAD NODE/"),
    (0, "all good", {"fail_regex": ("REALLY BAD",)}, "agree", ""),
    (1, "REALLY BAD", {"fail_regex": ("REALLY BAD",), "fail_codes": (2,)}, "build-error",
     "a different finding (exit code N is not a --fail-code (N)): REALLY BAD"),
])
def test_check_policy_decides_as_polygraphy_check_does(log_model, code, said, options, kind, detail):
    v = check(log_model, _exits(code, said), options=RunOptions(**options)).verdict
    assert v.signature.kind.value == kind
    if "a different finding" in detail:  # not the failure: its own (masked) words are its signature
        assert detail in v.signature.detail, v.signature.detail
    else:
        assert v.signature.detail == detail


def test_fail_code_on_another_target_is_a_usage_error(log_model):
    from reprokit.errors import UsageError

    with pytest.raises(UsageError, match="--fail-code/--ignore-fail-code applies only to a cmd target"):
        check(log_model, "emulate:fp16", options=RunOptions(fail_codes=(3,)))


@pytest.fixture
def log_writer(tmp_path):
    """A check command that computes Log in numpy, optionally scaled, and writes {outputs}."""
    return script(
        tmp_path,
        "log_outputs.py",
        """\
        import sys
        import numpy as np
        feeds = np.load(sys.argv[1])
        np.savez(sys.argv[2], y=np.log(feeds["x"]) * np.float32(sys.argv[3]))
    """,
    )


def test_command_writing_outputs_is_compared_numerically_agree(log_model, log_writer):
    opts = RunOptions(val_ranges={None: (1.0, 2.0)})
    result = check(log_model, f"cmd:{PY} {log_writer} {{inputs}} {{outputs}} 1.0", options=opts)
    v = result.verdict
    assert v.signature.kind is Kind.AGREE
    assert [o.name for o in v.outputs] == ["y"] and v.outputs[0].rel_l2 < 1e-6
    assert v.target_meta["wrote_outputs"] is True


def test_command_writing_outputs_is_compared_numerically_mismatch(log_model, log_writer):
    opts = RunOptions(val_ranges={None: (1.0, 2.0)})
    v = check(log_model, f"cmd:{PY} {log_writer} {{inputs}} {{outputs}} 1.1", options=opts).verdict
    assert v.signature == Signature(Kind.MISMATCH, ("y",))
    assert v.outputs[0].rel_l2 == pytest.approx(0.1, rel=1e-3)


def test_command_writing_wrong_output_names_is_reported(log_model, tmp_path):
    writer = script(
        tmp_path,
        "w.py",
        "import sys, numpy as np\nnp.savez(sys.argv[1], z=np.zeros((1, 8), np.float32))\n",
    )
    v = check(
        log_model,
        f"cmd:{PY} {writer} {{outputs}}",
        options=RunOptions(val_ranges={None: (1.0, 2.0)}),
    ).verdict
    assert v.signature == Signature(Kind.BUILD_ERROR, ("y",), "target output missing")
    assert v.message == "the target produced no output named 'y'"


def test_five_megabytes_of_output_are_handled_and_bounded(log_model, tmp_path):
    flood = script(
        tmp_path,
        "flood.py",
        """\
        import sys
        sys.stdout.write(("x" * 99 + "\\n") * 50_000)  # 5 MB
        print("final: boom")
        sys.exit(1)
    """,
    )
    start = time.monotonic()
    v = check(log_model, f"cmd:{PY} {flood}").verdict
    assert time.monotonic() - start < 60
    assert v.signature == Signature(
        Kind.BUILD_ERROR, detail="check command exit code 1"
    )
    assert len(v.message) < 64_000  # the tail, not 5 MB
    assert "final: boom" in v.message  # the check's last line leads the message (issue 28 item 6)


def test_command_gets_the_model_path_and_passes_by_exit_zero(log_model):
    cmd = (
        f"{PY} -c 'import sys, onnx; m = onnx.load(sys.argv[1]); "
        f'sys.exit(0 if m.graph.node[0].op_type == "Log" else 5)\' {{model}}'
    )
    v = check(log_model, "cmd:" + cmd).verdict
    assert v.signature.kind is Kind.AGREE  # exit 0 and no {outputs}: the check passes
    assert v.target_meta["argv"][-1] == os.path.abspath(log_model)
    assert v.target_meta["wrote_outputs"] is False
