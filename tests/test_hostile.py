"""Hostile conditions, end to end through the installed ``reprokit`` command.

1. ``shrink`` with a ``cmd`` check command that segfaults, aborts, hangs or eats memory on some
   candidates: the run still finishes with the original signature, the rest is counted.
2. SIGINT / SIGTERM at several moments of a shrink (and during the start-up imports), then
   ``--resume``: exit 130, one ``Error:`` line, no stray processes, a valid best-so-far, and the
   same minimal model as an uninterrupted run.
3. Determinism of two fresh runs (minimal.onnx, report archive members).
4. Corrupt models, feeds and a check command that prints 20 MB: one ``Error:``/``Hint:`` pair,
   the documented exit code, bounded memory, no partial result.
5. ``verify`` against hostile archives: traversal, absolute paths, links, bombs, manifests that
   lie, pickled feeds, corrupt streams.
6. A full disk (tmpfs, or RLIMIT_FSIZE) while writing the report or the best-so-far.

Engines are real: onnxruntime, the fp16 storage emulator, and ``cmd`` targets running the python
scripts below, written into tmp_path. Models are the committed samples or tiny graphs built here.
Where reprokit misbehaves the test stays, as a strict xfail whose reason names the cause and fix.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import json
import os
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_user_error, pid_gone, reprokit_exe
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
LAYERNORM = "samples/layernorm_overflow.onnx"  # relative to REPO: the README's own command line
LAYERNORM_INPUTS = "samples/layernorm_overflow.inputs.npz"
PY = sys.executable
FLOAT = TensorProto.FLOAT
# --max-calls 0: a long search (no call budget), so interrupts land while it is still running
SHRINK_LAYERNORM = ["shrink", LAYERNORM, "--target", "emulate:fp16", "--no-localize", "--max-calls", "0",
                    "--inputs", LAYERNORM_INPUTS]
DISK_WORDS = ("no space", "disk is full", "disk full", "file too large", "cannot write",
              "could not write", "write failed", "failed to write")


# -- running reprokit ------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    env.update(extra)
    return env


def reprokit(*args, cwd=None, timeout: float = 120, env=None, preexec_fn=None):
    return subprocess.run(
        [reprokit_exe(), *map(str, args)], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, env=env or child_env(), stdin=subprocess.DEVNULL, preexec_fn=preexec_fn,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def assert_disk_error(proc) -> None:
    """A full disk is the user's environment, not a reprokit bug: a clear one-line error."""
    text = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 1, 70), f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in text, text[-3000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr[-2000:]
    assert any(word in errors[0].lower() for word in DISK_WORDS), errors[0]
    assert "internal error" not in errors[0], errors[0]
    assert len([line for line in proc.stderr.splitlines() if line.startswith("Hint:")]) == 1


def processes_mentioning(marker: str) -> list[str]:
    """Live processes (zombies excluded) whose command line contains ``marker`` - a test's
    tmp_path: the workers (``python -m reprokit.engine.worker OUT/.reprokit/calls/...``) and the check
    scripts of this test carry it; other sessions' ``reprokit.engine.worker`` processes do not."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        text = cmdline.replace(b"\0", b" ").decode("utf-8", "replace")
        if marker in text and not pid_gone(int(entry)):
            found.append(f"{entry}: {text[:300]}")
    return found


def assert_no_leftovers(marker: str, grace: float = 5.0) -> None:
    deadline = time.monotonic() + grace
    left = processes_mentioning(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_mentioning(marker)
    assert not left, "processes left running:\n" + "\n".join(left)


def sha_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def write_script(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def cmd_target(script: Path, *args: str) -> str:
    return "cmd:" + " ".join(shlex.quote(str(a)) for a in (PY, script, *args))


# -- models ----------------------------------------------------------------------------------


def make_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def unary_chain(ops: list[str], width: int = 8, head=None) -> onnx.ModelProto:
    """x[1,width] -> ops[0] -> t0 -> ops[1] -> t1 ... -> y; ``head`` = (node, initializer, in_shape)
    replaces the first op (an Expand that widens the input)."""
    nodes, prev, inits, in_shape = [], "x", [], [1, width]
    for i, op in enumerate(ops):
        out = f"t{i}" if i < len(ops) - 1 else "y"
        if i == 0 and head is not None:
            make_node, init, in_shape = head
            nodes.append(make_node(prev, out))
            inits.append(init)
        else:
            attrs = {"axis": -1} if op == "Softmax" else {}
            nodes.append(helper.make_node(op, [prev], [out], name=f"n{i}_{op.lower()}", **attrs))
        prev = out
    return make_model(nodes, [helper.make_tensor_value_info("x", FLOAT, in_shape)],
                      [helper.make_tensor_value_info("y", FLOAT, [1, width])], inits)


def crash_chain() -> onnx.ModelProto:
    """24 unary nodes; the Softmax (n22) is the bug. The prefixes the end bisection tries end in
    Relu (n11), Neg (n17), Abs (n20) and Sigmoid (n21): one hostile behaviour each."""
    # x[1,8] -> Tanh -> Exp -> ... -> n11 Relu -> ... -> n17 Neg -> ... -> n20 Abs -> n21 Sigmoid
    #        -> n22 Softmax -> n23 Exp -> y[1,8]
    ops = ["Tanh", "Exp"] * 12
    ops[11], ops[17], ops[20], ops[21], ops[22] = "Relu", "Neg", "Abs", "Sigmoid", "Softmax"
    return unary_chain(ops)


def wide_expand_chain(width: int = 262_144) -> onnx.ModelProto:
    """Small model file, one 1 MiB activation: cutting at t0 makes the minimal's feeds 1 MiB."""
    # x[1,1] -> Expand([1,W]) -> t0 -> Neg -> Abs -> Neg -> Softmax -> Neg -> Abs -> y[1,W]
    shape = numpy_helper.from_array(np.array([1, width], np.int64), "shape")

    def expand(src, out):
        return helper.make_node("Expand", [src, "shape"], [out], name="n0_expand")

    ops = ["Expand", "Neg", "Abs", "Neg", "Softmax", "Neg", "Abs"]
    return unary_chain(ops, width, head=(expand, shape, [1, 1]))


def scale_model(width: int = 8) -> onnx.ModelProto:
    """x in [0,1) times 1e5 passes fp16's 65504: emulate:fp16 gives inf (nonfinite)."""
    # x[1,W] -> Mul(k = 1e5) -> y[1,W]
    return make_model(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="scale")],
        [helper.make_tensor_value_info("x", FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", FLOAT, [1, width])],
        [numpy_helper.from_array(np.array([1e5], np.float32), "k")],
    )


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def real_inputs(model: onnx.ModelProto) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def assert_consistent_best(out: Path, status: str | None = None) -> dict:
    """minimal.onnx, inputs.npz and summary.json are valid and describe the same model."""
    minimal = onnx.load(str(out / "minimal.onnx"))
    onnx.checker.check_model(minimal, full_check=True)
    summary = json.loads((out / "summary.json").read_text())
    if status is not None:
        assert summary["status"] == status
    assert summary["minimal"]["node_names"] == [n.name for n in minimal.graph.node], (
        "summary.json and minimal.onnx describe different models")
    with np.load(out / "inputs.npz", allow_pickle=False) as data:
        feeds = {k: data[k].shape for k in data.files}
    assert sorted(feeds) == sorted(real_inputs(minimal)), (
        f"inputs.npz holds {sorted(feeds)}, minimal.onnx takes {real_inputs(minimal)}")
    for vi in minimal.graph.input:
        if vi.name in feeds:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            assert list(feeds[vi.name]) == dims, (vi.name, feeds[vi.name], dims)
    return summary


# == 1. a check command that crashes, aborts, hangs, eats memory ==============================

HOSTILE_CHECK = r'''
    """Stands in for an engine build: 'Error Code 2' for any model holding a Softmax (the bug
    being shrunk); any other candidate dies, chosen by its last op type: Neg aborts, Abs hangs,
    Sigmoid eats memory until 'killed', anything else segfaults — but a lone Identity (reprokit's
    probe of the check, holding nothing of the model) builds."""
    import os, resource, signal, sys, time
    import onnx

    model, log = sys.argv[1], sys.argv[2]
    ops = [n.op_type for n in onnx.load(model).graph.node]
    kind = "fail" if "Softmax" in ops else {"Neg": "abort", "Abs": "hang", "Sigmoid": "oom"}.get(ops[-1], "segv")
    kind = "pass" if ops == ["Identity"] else kind
    with open(log, "a") as handle:
        handle.write(f"{len(ops)} {kind}\n")
    sys.stdout.flush()
    if kind == "fail":
        print("[E] Error Code 2: Internal Error (Softmax: could not find any implementation)")
        sys.exit(1)
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "abort":
        os.abort()
    if kind == "hang":
        time.sleep(60)
    if kind == "oom":
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # never harms the machine
        hog = []
        try:
            while True:
                hog.append(bytes(64 << 20))  # calloc: address space, no page touched
        except MemoryError:
            hog.clear()
            print("Killed", flush=True)  # what the OOM killer leaves in a log
            os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
'''

# (verdict kind, detail) the README promises for each hostile behaviour
HOSTILE_FINDING = {"segv": ("crash", "SIGSEGV"), "abort": ("crash", "SIGABRT"),
                   "oom": ("crash", "SIGKILL"), "hang": ("timeout", "")}


def test_shrink_survives_check_command_that_segfaults_aborts_hangs_and_eats_memory(tmp_path):
    model = save(crash_chain(), tmp_path / "chain.onnx")
    script = write_script(tmp_path / "check.py", HOSTILE_CHECK)
    log, out = tmp_path / "calls.log", tmp_path / "out"
    target = cmd_target(script, "{model}", str(log))
    # --no-localize: the message names the Softmax, which would settle it in one call; the
    # search path is what meets the hostile candidates.
    proc = reprokit("shrink", model, "--target", target, "--timeout", "3", "-o", out, "--no-pack",
                    "--no-localize", timeout=60)  # the whole run is bounded: a hang costs 3 s, not 60
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr

    behaviours = Counter(line.split()[1] for line in log.read_text().splitlines())
    assert set(HOSTILE_FINDING) <= set(behaviours), (
        f"the search no longer reached every hostile candidate ({dict(behaviours)}); "
        "re-place the Relu/Neg/Abs/Sigmoid nodes of crash_chain() on the new search path")

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["signature"]["kind"] == "build-error"
    assert summary["signature"]["detail"] == "check command exit code 1"  # the exit status, as --check means it
    assert summary["verdict"]["signature"] == summary["signature"], "the minimal model slipped"
    assert summary["minimal"]["ops"] == ["Softmax"]
    findings = summary["other_findings"]
    for behaviour, (kind, detail) in HOSTILE_FINDING.items():
        keys = [k for k in findings if k.startswith(kind) and detail in k]
        assert len(keys) == 1, f"{behaviour}: expected one {kind} {detail} finding in {findings}"
        assert findings[keys[0]] >= behaviours[behaviour], (behaviour, findings, behaviours)
    assert len(findings) == len(HOSTILE_FINDING), f"unexpected other findings: {findings}"

    onnx.checker.check_model(onnx.load(str(out / "minimal.onnx")), full_check=True)
    again = subprocess.run([PY, str(script), str(out / "minimal.onnx"), str(tmp_path / "again.log")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "Error Code 2" in again.stdout, "the minimal model passes"
    assert_no_leftovers(str(tmp_path))  # the 60 s sleeper died with its process group


UNREADABLE_OUTPUTS = {
    "object-array": """
        import sys
        import numpy as np
        np.savez(sys.argv[1], y=np.array([{"a": 1}], dtype=object))  # needs pickling to load
    """,
    "not-a-zip": """
        import sys
        open(sys.argv[1], "w").write("this is not an npz")
    """,
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_OUTPUTS))
def test_check_command_writing_unreadable_outputs_is_an_input_error(tmp_path, case):
    model = save(crash_chain(), tmp_path / "chain.onnx")
    script = write_script(tmp_path / "writes_outputs.py", UNREADABLE_OUTPUTS[case])
    proc = reprokit("check", model, "--target", cmd_target(script, "{outputs}"))
    assert_user_error(proc, 3, contains="outputs")


# == 2. SIGINT / SIGTERM during a shrink, then --resume ========================================


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The README's shrink of layernorm_overflow (with its report archive), never interrupted."""
    out = tmp_path_factory.mktemp("hostile-uninterrupted") / "out"
    proc = reprokit(*SHRINK_LAYERNORM, "-o", out, cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def journal_lines(out: Path) -> int:
    try:
        with open(out / ".reprokit" / "journal.jsonl", "rb") as handle:
            return sum(1 for line in handle if line.endswith(b"\n"))
    except OSError:
        return 0


def start_shrink(out: Path, logs: Path, *extra: str) -> subprocess.Popen:
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "stdout.txt", "w") as stdout, open(logs / "stderr.txt", "w") as stderr:
        return subprocess.Popen(
            [reprokit_exe(), *SHRINK_LAYERNORM, "-o", str(out), "--no-pack", *extra], cwd=REPO,
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=child_env())


def wait_for(proc: subprocess.Popen, ready, what: str, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"reprokit exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not happen within {limit} s")
        time.sleep(0.01)


def interrupt(proc: subprocess.Popen, sig: int, logs: Path, marker: str) -> None:
    """Send ``sig``; reprokit must stop at once with exit 130, one Error line, no traceback,
    and no engine process left behind."""
    sent = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    latency = time.monotonic() - sent
    stderr = (logs / "stderr.txt").read_text()
    text = (logs / "stdout.txt").read_text() + stderr
    assert code == 130, f"exit {code}\n{stderr[-2000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert error_lines(stderr) == ["Error: interrupted"], stderr[-2000:]
    assert len([line for line in stderr.splitlines() if line.startswith("Hint:")]) == 1
    assert latency < 15, f"took {latency:.1f} s to stop"
    assert_no_leftovers(marker)


def resume_to_the_uninterrupted_result(out: Path, uninterrupted: Path) -> None:
    resumed = reprokit(*SHRINK_LAYERNORM, "-o", out, "--no-pack", "--resume", cwd=REPO, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_consistent_best(out, status="done")
    assert (out / "minimal.onnx").read_bytes() == (uninterrupted / "minimal.onnx").read_bytes()
    with np.load(out / "inputs.npz") as mine, np.load(uninterrupted / "inputs.npz") as theirs:
        assert sorted(mine.files) == sorted(theirs.files)
        for name in mine.files:
            np.testing.assert_array_equal(mine[name], theirs[name])


@pytest.mark.slow
def test_shrink_interrupted_at_three_moments_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted):
    """Ctrl-C after 1 journal line, SIGTERM of the resumed run after 5, Ctrl-C of the next
    resume near the end (5 lines before the uninterrupted run's last), then a last --resume:
    same minimal.onnx as never interrupted."""
    out = tmp_path / "out"
    total = journal_lines(uninterrupted)
    assert total >= 12, f"the uninterrupted run journaled only {total} verdicts: too short to interrupt 3 times"
    near_end = total - 5
    for round_, (sig, lines) in enumerate([(signal.SIGINT, 1), (signal.SIGTERM, 5), (signal.SIGINT, near_end)]):
        logs = tmp_path / f"logs{round_}"
        proc = start_shrink(out, logs, *(["--resume"] if round_ else []))
        wait_for(proc, lambda n=lines: journal_lines(out) >= n, f"the journal reached {lines} lines")
        interrupt(proc, sig, logs, str(tmp_path))
        assert_consistent_best(out, status="interrupted")
    resume_to_the_uninterrupted_result(out, uninterrupted)


@pytest.mark.slow
def test_shrink_terminated_in_its_first_second_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted):
    """SIGTERM as soon as OUT/.reprokit exists: before the reference capture, before any
    divergence is confirmed. There is no best-so-far yet, and nothing may pose as one."""
    out = tmp_path / "out"
    proc = start_shrink(out, tmp_path / "logs")
    wait_for(proc, lambda: (out / ".reprokit").is_dir(), "OUT/.reprokit appeared")
    interrupt(proc, signal.SIGTERM, tmp_path / "logs", str(tmp_path))
    if (out / "minimal.onnx").exists():
        assert_consistent_best(out, status="interrupted")
    else:
        assert not (out / "summary.json").exists() or json.loads(
            (out / "summary.json").read_text())["status"] == "interrupted"
    resume_to_the_uninterrupted_result(out, uninterrupted)


SLOW_IMPORT = '''
    """sitecustomize for one test: holds the import of click for 30 s (a cold page cache, a
    network home directory), so a signal lands while `from reprokit.cli import main` runs."""
    import sys, time

    class _SlowClick:
        def find_spec(self, name, path=None, target=None):
            if name == "click":
                sys.meta_path.remove(self)
                sys.stderr.write("hostile-test: importing click\\n")
                sys.stderr.flush()
                time.sleep(30)
            return None

    sys.meta_path.insert(0, _SlowClick())
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_start_up_imports_is_a_clean_interrupt(tmp_path, sig):
    hook = tmp_path / "hook"
    hook.mkdir()
    write_script(hook / "sitecustomize.py", SLOW_IMPORT)
    proc = subprocess.Popen(
        [reprokit_exe(), "check", LAYERNORM, "--target", "emulate:fp16"], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=child_env(PYTHONPATH=str(hook)))
    try:
        assert "importing click" in proc.stderr.readline()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{stderr[-2000:]}"
    assert "Traceback" not in stdout + stderr, stderr[-2000:]
    assert error_lines(stderr) == ["Error: interrupted"], stderr


HANG_CHECK = '''
    """The full model fails at once; every smaller candidate hangs (logged before it sleeps)."""
    import sys, time
    import onnx

    model, log = sys.argv[1], sys.argv[2]
    nodes = len(onnx.load(model).graph.node)
    if nodes == 24:
        print("[E] Error Code 2: Internal Error")
        sys.exit(1)
    with open(log, "a") as handle:
        handle.write(f"{nodes} hang\\n")
    time.sleep(60)
'''


def test_ctrl_c_with_parallel_jobs_stops_at_once(tmp_path):
    """Two speculative candidates hang (--timeout 8): Ctrl-C must kill them, not wait them out.
    (Was a bug until a338563: Reducer.close() waited for the in-flight calls' --timeout.)"""
    model = save(crash_chain(), tmp_path / "chain.onnx")
    script = write_script(tmp_path / "hang.py", HANG_CHECK)
    log, out = tmp_path / "hangs.log", tmp_path / "out"
    with open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(
            [reprokit_exe(), "shrink", str(model), "--target", cmd_target(script, "{model}", str(log)),
             "--timeout", "8", "-j", "2", "-o", str(out), "--no-pack"],
            stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL, env=child_env())
    try:
        wait_for(proc, lambda: log.exists() and len(log.read_text().splitlines()) >= 2,
                 "two candidates were in flight", limit=60)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        latency = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert code == 130
    assert latency < 5, f"Ctrl-C took {latency:.1f} s to take effect with --jobs 2"
    assert_no_leftovers(str(tmp_path), grace=1.0)


# == 3. determinism ===========================================================================


def archive_members(path: Path) -> dict[str, bytes]:
    """Regular files of a report archive, keyed by their path below the top folder."""
    out = {}
    with tarfile.open(path) as archive:
        for info in archive:
            if info.isfile():
                out[info.name.split("/", 1)[1]] = archive.extractfile(info).read()
    return out


@pytest.mark.slow
def test_two_fresh_runs_give_the_same_minimal_model_and_report(tmp_path, uninterrupted):
    out = tmp_path / "out"
    proc = reprokit(*SHRINK_LAYERNORM, "-o", out, cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "minimal.onnx").read_bytes() == (uninterrupted / "minimal.onnx").read_bytes()

    first, second = archive_members(uninterrupted / "report.tar.gz"), archive_members(out / "report.tar.gz")
    assert sorted(first) == sorted(second)
    for name in ("model.onnx", "inputs.npz", "repro.py", "reference_outputs.npz",
                 "target_outputs.npz", "inputs.json", "commands.sh", "ISSUE.md", "README.md"):
        assert first[name] == second[name], f"{name} differs between two identical runs"
    verdicts = [json.loads(m["verdict.json"]) for m in (first, second)]
    for verdict in verdicts:
        verdict.pop("seconds")
    assert verdicts[0] == verdicts[1]
    # The archives are NOT byte-identical, for reasons that are not reprokit's to fix: polygraphy's
    # logs carry timestamps, runtimes and the pack's temporary directory, verdict.json carries
    # "seconds", env.json the cwd/hostname, and MANIFEST.json hashes all of these. Nothing else.
    differing = {name for name in first if first[name] != second[name]}
    explained = {"verdict.json", "MANIFEST.json", "env.json"}
    assert {n for n in differing if not n.startswith("logs/")} <= explained, differing


# == 4. corrupt models, feeds and a flood of output ===========================================


def corrupt_input(case: str, tmp_path: Path) -> tuple[Path, Path | None, str]:
    """(model, inputs or None, a fragment the Error line must hold) for one corruption."""
    sample = REPO / LAYERNORM
    work = tmp_path / "user"
    work.mkdir()
    if case == "truncated-onnx":
        data = sample.read_bytes()
        (work / "half.onnx").write_bytes(data[: len(data) // 2])
        return work / "half.onnx", None, "half.onnx"
    if case == "random-bytes-onnx":
        (work / "noise.onnx").write_bytes(np.random.default_rng(7).bytes(8192))
        return work / "noise.onnx", None, "noise.onnx"
    if case in ("external-data-missing", "external-data-truncated"):
        onnx.save(onnx.load(str(sample)), str(work / "m.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
        weights = work / "w.bin"
        if case == "external-data-missing":
            weights.unlink()
            return work / "m.onnx", None, "missing"
        with open(weights, "r+b") as handle:
            handle.truncate(weights.stat().st_size // 2)
        return work / "m.onnx", None, "truncated"
    with np.load(REPO / LAYERNORM_INPUTS) as data:
        (name,) = data.files
        image = data[name]
    npz = work / f"{case}.npz"
    if case == "npz-wrong-names":
        np.savez(npz, not_an_input=image)
        return sample, npz, "not_an_input"
    if case == "npz-float64-past-float32":  # float64 feeds are cast, but not values float32 cannot hold
        np.savez(npz, **{name: image.astype(np.float64) * 1e300})
        return sample, npz, "float64"
    if case == "npz-wrong-shape":
        np.savez(npz, **{name: image[..., :-1]})
        return sample, npz, "shape"
    if case == "npz-object-array":
        np.savez(npz, **{name: np.array([{"evil": 1}], dtype=object)})
        return sample, npz, "pickl"
    if case == "npz-not-a-zip":
        npz.write_text("name,value\nimage,1\n")
        return sample, npz, "zip"
    raise AssertionError(case)


CORRUPT = ["truncated-onnx", "random-bytes-onnx", "external-data-missing", "external-data-truncated",
           "npz-wrong-names", "npz-float64-past-float32", "npz-wrong-shape", "npz-object-array", "npz-not-a-zip"]
COMMANDS = [pytest.param(c, p, id=f"{c}-{p}") for c in CORRUPT for p in ("check", "shrink")] + [
    pytest.param(c, "pack", id=f"{c}-pack")
    for c in ("truncated-onnx", "external-data-missing", "npz-object-array")]


@pytest.mark.parametrize("case, command", COMMANDS)
def test_corrupt_input_is_one_clear_error_with_no_partial_result(tmp_path, case, command):
    model, inputs, fragment = corrupt_input(case, tmp_path)
    before = sha_files(tmp_path / "user")
    out = tmp_path / "out"
    args = [command, model, "--target", "emulate:fp16"]
    if inputs is not None:
        args += ["--inputs", inputs]
    if command == "shrink":
        args += ["-o", out]
    if command == "pack":
        args += ["-o", out / "report.tar.gz"]
    proc = reprokit(*args, cwd=tmp_path)
    assert_user_error(proc, 3, contains=fragment)
    assert sha_files(tmp_path / "user") == before, "reprokit wrote to the user's files"
    if command == "shrink":
        assert not (out / "minimal.onnx").exists() and not (out / "summary.json").exists()
    if command == "pack":
        assert not out.exists() or not [p.name for p in out.iterdir()], list(out.iterdir())
    assert_no_leftovers(str(tmp_path), grace=2.0)


def test_npz_with_a_truncated_member_is_not_called_a_pickle(tmp_path):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1, 3, 32, 32)})
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as archive:
        archive.writestr("image.npy", header.getvalue() + b"\0" * 16)  # 16 of 12288 data bytes
    proc = reprokit("check", REPO / LAYERNORM, "--target", "emulate:fp16",
                    "--inputs", tmp_path / "short.npz")
    error, _ = assert_user_error(proc, 3, contains="short.npz")
    assert "pickl" not in error, error


RSS_WRAPPER = '''
    """Run a command; report its exit code, output sizes and the peak RSS of its process tree."""
    import json, resource, subprocess, sys

    proc = subprocess.run(sys.argv[1:], capture_output=True, stdin=subprocess.DEVNULL)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"rc": proc.returncode, "maxrss_kib": usage.ru_maxrss,
                      "stdout_bytes": len(proc.stdout), "stderr_bytes": len(proc.stderr),
                      "stdout": proc.stdout.decode("utf-8", "replace")[-3000:],
                      "stderr": proc.stderr.decode("utf-8", "replace")[-3000:]}))
'''
# fails on every model of the chain (none holds an Identity), passes reprokit's one-node Identity probe
FLOOD = ("cmd:" + shlex.quote(PY) + " -c \"import sys; print('x' * 20_000_000); "
         "raise SystemExit(b'Identity' not in open(sys.argv[1], 'rb').read())\" {model}")


@pytest.mark.parametrize("command", ["check", "shrink"])
def test_check_command_printing_20_mb_keeps_memory_and_output_bounded(tmp_path, command):
    """A failing check command is a divergence (build-error), not an error: check exits 1 and
    shrink reduces it. Its 20 MB of output must not reach the terminal, summary.json or RAM."""
    wrapper = write_script(tmp_path / "rss.py", RSS_WRAPPER)
    model = save(crash_chain(), tmp_path / "chain.onnx")
    out = tmp_path / "out"
    args = [command, str(model), "--target", FLOOD]
    if command == "shrink":
        args += ["-o", str(out), "--no-pack"]
    done = subprocess.run([PY, str(wrapper), reprokit_exe(), *args], capture_output=True, text=True,
                          timeout=120, env=child_env(), cwd=tmp_path)
    result = json.loads(done.stdout)
    assert result["rc"] == (1 if command == "check" else 0), result["stderr"]
    assert "Traceback" not in result["stdout"] + result["stderr"]
    assert result["stdout_bytes"] + result["stderr_bytes"] < 256 << 10, "the flood reached the terminal"
    assert result["maxrss_kib"] < 1 << 20, f"peak RSS {result['maxrss_kib'] / 1024:.0f} MiB"
    if command == "check":
        assert "build-error" in result["stdout"]
    else:
        assert (out / "summary.json").stat().st_size < 1 << 20
        summary = json.loads((out / "summary.json").read_text())
        assert summary["signature"]["kind"] == "build-error"
        assert summary["minimal"]["nodes"] == 1
        assert len(summary["signature"]["detail"]) <= 300


# == 5. verify against hostile archives =======================================================


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A real report archive of a one-node diverging model, and its members by full name."""
    root = tmp_path_factory.mktemp("hostile-pack")
    model = save(scale_model(), root / "tiny.onnx")
    archive = root / "rep.tar.gz"
    proc = reprokit("pack", model, "--target", "emulate:fp16", "-o", archive, cwd=root, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(archive) as tar:
        members = {i.name: tar.extractfile(i).read() for i in tar if i.isfile()}
    assert all(name.startswith("rep/") for name in members)
    return archive, members


def regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, data


def special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def write_tgz(path: Path, entries) -> Path:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in entries:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def write_raw_tgz(path: Path, headers: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """Tar headers followed by whatever data we like: the header's size may lie."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for info, data in headers:
            gz.write(info.tobuf(format=tarfile.PAX_FORMAT))
            gz.write(data)
    return path


def write_zip(path: Path, items, modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in items:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            archive.writestr(info, data)
    return path


def with_manifest(members: dict[str, bytes]) -> dict[str, bytes]:
    """Recompute MANIFEST.json the way `reprokit pack` writes it, so the manifest check passes."""
    files = {n[len("rep/"):]: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
             for n, d in members.items() if n != "rep/MANIFEST.json"}
    manifest = json.loads(members["rep/MANIFEST.json"])
    manifest["files"] = files
    return {**members, "rep/MANIFEST.json": json.dumps(manifest, indent=2, sort_keys=True).encode()}


def edit_manifest(members: dict[str, bytes], change) -> dict[str, bytes]:
    manifest = json.loads(members["rep/MANIFEST.json"])
    change(manifest["files"])
    return {**members, "rep/MANIFEST.json": json.dumps(manifest).encode()}


def patch_zip_size(data: bytes, name: bytes, size: int) -> bytes:
    """Make the zip's local and central headers of ``name`` declare ``size`` uncompressed bytes."""
    raw = bytearray(data)
    for sig, name_len_at, name_at, size_at in ((b"PK\x03\x04", 26, 30, 22), (b"PK\x01\x02", 28, 46, 24)):
        pos = raw.find(sig)
        while pos >= 0:
            length = struct.unpack("<H", raw[pos + name_len_at: pos + name_len_at + 2])[0]
            if raw[pos + name_at: pos + name_at + length] == name:
                raw[pos + size_at: pos + size_at + 4] = struct.pack("<I", size)
            pos = raw.find(sig, pos + 4)
    return bytes(raw)


EVIL_ABS = f"/tmp/reprokit-hostile-{os.getpid()}-evil.txt"


def hostile_archive(case: str, members: dict[str, bytes], original: Path, d: Path) -> Path:
    files = [regular(n, b) for n, b in members.items()]
    if case == "unmodified":
        return original
    if case == "rebuilt-unmodified":  # proves the builders below change only what they say
        return write_tgz(d / "a.tar.gz", files)
    if case == "traversal":
        return write_tgz(d / "a.tar.gz", [regular("../../evil.txt", b"evil")] + files)
    if case == "traversal-inside-top":
        return write_tgz(d / "a.tar.gz", files + [regular("rep/../../evil.txt", b"evil")])
    if case == "absolute-path":
        return write_tgz(d / "a.tar.gz", files + [regular(EVIL_ABS, b"evil")])
    if case == "symlink":
        return write_tgz(d / "a.tar.gz", files + [special("rep/link", tarfile.SYMTYPE, "/etc/passwd")])
    if case == "hardlink":
        return write_tgz(d / "a.tar.gz", files + [special("rep/hard", tarfile.LNKTYPE, "/etc/passwd")])
    if case == "fifo":
        return write_tgz(d / "a.tar.gz", files + [special("rep/fifo", tarfile.FIFOTYPE)])
    if case == "bomb-header-declares-5GiB":
        info = tarfile.TarInfo("rep/bomb.bin")
        info.size = 5 << 30
        return write_raw_tgz(d / "a.tar.gz", [(info, b"\0" * 512)])
    if case == "bomb-two-3GiB-members":
        headers = []
        for k in range(2):
            info = tarfile.TarInfo(f"rep/bomb{k}.bin")
            info.size = 3 << 30
            headers.append((info, b"\0" * 512))
        return write_raw_tgz(d / "a.tar.gz", headers)
    if case == "truncated-tar-gz":
        data = original.read_bytes()
        (d / "a.tar.gz").write_bytes(data[: len(data) // 2])
        return d / "a.tar.gz"
    if case == "model-byte-changed":
        model = bytearray(members["rep/model.onnx"])
        model[-1] ^= 1
        return write_tgz(d / "a.tar.gz", [regular(n, bytes(model) if n == "rep/model.onnx" else b)
                                          for n, b in members.items()])
    if case == "manifest-omits-a-file":
        edited = edit_manifest(members, lambda f: f.pop("README.md"))
        return write_tgz(d / "a.tar.gz", [regular(n, b) for n, b in edited.items()])
    if case == "manifest-lists-a-missing-file":
        edited = edit_manifest(members, lambda f: f.update({"weights.bin": {"sha256": "0" * 64, "bytes": 1}}))
        return write_tgz(d / "a.tar.gz", [regular(n, b) for n, b in edited.items()])
    if case == "two-top-folders":
        return write_tgz(d / "a.tar.gz", files + [regular("other/notes.txt", b"x")])
    if case == "pickled-inputs-with-matching-manifest":
        buf = io.BytesIO()
        np.savez(buf, x=np.array([{"evil": 1}], dtype=object))
        edited = with_manifest({**members, "rep/inputs.npz": buf.getvalue()})
        return write_tgz(d / "a.tar.gz", [regular(n, b) for n, b in edited.items()])
    if case.startswith(("verdict-", "manifest-schema-")):  # issue 28 item 4: malformed, manifest matching
        return write_tgz(d / "a.tar.gz", [regular(n, b) for n, b in malformed(case, members).items()])
    if case == "zip-traversal":
        return write_zip(d / "a.zip", list(members.items()) + [("rep/../../evil.txt", b"evil")])
    if case == "zip-absolute-path":
        return write_zip(d / "a.zip", list(members.items()) + [(EVIL_ABS, b"evil")])
    if case == "zip-symlink":
        return write_zip(d / "a.zip", list(members.items()) + [("rep/link", b"/etc/passwd")],
                         {"rep/link": 0o120777})
    if case == "zip-corrupt-member":
        data = bytearray(write_zip(d / "ok.zip", list(members.items())).read_bytes())
        at = data.find(b"rep/repro.py") + len(b"rep/repro.py") + 64  # inside its deflate stream
        data[at] ^= 0xFF
        (d / "ok.zip").unlink()
        (d / "a.zip").write_bytes(bytes(data))
        return d / "a.zip"
    if case == "zip-bomb-size-lies":
        write_zip(d / "ok.zip", list(members.items()) + [("rep/bomb.bin", b"\0" * (8 << 20))])
        data = patch_zip_size((d / "ok.zip").read_bytes(), b"rep/bomb.bin", 10)
        (d / "ok.zip").unlink()
        (d / "a.zip").write_bytes(data)
        return d / "a.zip"
    raise AssertionError(case)


def malformed(case: str, members: dict[str, bytes]) -> dict[str, bytes]:
    """verdict.json or MANIFEST.json edited as issue 28 found them, the manifest's hashes right."""
    verdict = json.loads(members["rep/verdict.json"])
    edits = {
        "verdict-no-signature": lambda v: v.pop("signature"),
        "verdict-metric-bogus": lambda v: v["criterion"].update(metric="bogus"),
        "verdict-tolerance-abc": lambda v: v["criterion"].update(tolerance="abc"),
        "verdict-criterion-a-list": lambda v: v.update(criterion=[1, 2]),
        "verdict-signature-kind-a-number": lambda v: v["signature"].update(kind=3),
        "verdict-check-policy-codes-strings": lambda v: v.update(check_policy={"fail_codes": ["x"]}),
    }
    if case in edits:
        edits[case](verdict)
        return with_manifest({**members, "rep/verdict.json": json.dumps(verdict).encode()})
    manifest = json.loads(members["rep/MANIFEST.json"])
    if case == "manifest-schema-files-a-list":
        manifest["files"] = sorted(manifest["files"])
    elif case == "manifest-schema-entry-a-string":
        manifest["files"]["README.md"] = "ok"
    elif case == "manifest-schema-no-schema":
        manifest.pop("schema")
    return {**members, "rep/MANIFEST.json": json.dumps(manifest).encode()}


def bug(reason: str):
    return pytest.mark.xfail(strict=True, reason="BUG: " + reason)


CORRUPT_STREAM = (
    "reprokit/archive.py:safe_extract guards only tarfile.open(); errors raised while iterating "
    "or reading members (tarfile.ReadError 'unexpected end of data', EOFError, zlib.error, "
    "zipfile.BadZipFile 'Bad CRC-32') escape as {what}. Fix: wrap the member loop and "
    "_write_member in except (tarfile.TarError, EOFError, zlib.error, zipfile.BadZipFile, OSError) "
    "-> _refuse(archive, 'corrupt or truncated archive: ...') (exit 3)")

VERIFY_CASES = [
    pytest.param("unmodified", 1, "REPRODUCES"),
    pytest.param("rebuilt-unmodified", 1, "REPRODUCES"),
    pytest.param("traversal", 3, "outside the top folder"),
    pytest.param("traversal-inside-top", 3, "outside the top folder"),
    pytest.param("absolute-path", 3, "absolute path"),
    pytest.param("symlink", 3, "link"),
    pytest.param("hardlink", 3, "link"),
    pytest.param("fifo", 3, "not a regular file"),
    pytest.param("bomb-header-declares-5GiB", 3, "bomb"),
    pytest.param("bomb-two-3GiB-members", 3, ""),
    pytest.param("truncated-tar-gz", 3, ""),
    pytest.param("model-byte-changed", 3, "does not match"),
    pytest.param("manifest-omits-a-file", 3, "not in the manifest"),
    pytest.param("manifest-lists-a-missing-file", 3, "listed but missing"),
    pytest.param("two-top-folders", 3, "more than one top folder"),
    pytest.param("pickled-inputs-with-matching-manifest", 3, "pickl"),
    pytest.param("zip-traversal", 3, "outside the top folder"),
    pytest.param("verdict-no-signature", 3, "verdict.json does not follow its schema: signature is missing"),
    pytest.param("verdict-metric-bogus", 3, "criterion.metric must be one of"),
    pytest.param("verdict-tolerance-abc", 3, "criterion.tolerance must be a number, got 'abc'"),
    pytest.param("verdict-criterion-a-list", 3, "criterion must be an object, got a list"),
    pytest.param("verdict-signature-kind-a-number", 3, "signature.kind must be a string"),
    pytest.param("verdict-check-policy-codes-strings", 3, "check_policy.fail_codes[0] must be an integer"),
    pytest.param("manifest-schema-files-a-list", 3, "MANIFEST.json does not follow its schema: files must be"),
    pytest.param("manifest-schema-entry-a-string", 3, "files['README.md'] must be an object"),
    pytest.param("manifest-schema-no-schema", 3, "MANIFEST.json does not follow its schema: schema is missing"),
    pytest.param("zip-absolute-path", 3, "absolute path"),
    pytest.param("zip-symlink", 3, "link"),
    pytest.param("zip-corrupt-member", 3, ""),
    pytest.param("zip-bomb-size-lies", 3, ""),
]


@pytest.mark.parametrize("case, code, fragment", VERIFY_CASES)
def test_verify_refuses_hostile_archive(tmp_path, packed, case, code, fragment):
    original, members = packed
    build, cwd, tmp = tmp_path / "build", tmp_path / "cwd", tmp_path / "tmp"
    for folder in (build, cwd, tmp):
        folder.mkdir()
    archive = hostile_archive(case, members, original, build)
    def outside_tmp():
        return {k: v for k, v in sha_files(tmp_path).items() if not k.startswith("tmp/")}

    before = outside_tmp()
    proc = reprokit("verify", archive, cwd=cwd, env=child_env(TMPDIR=str(tmp)), timeout=120)
    if code == 1:
        assert proc.returncode == 1 and fragment in proc.stdout, proc.stderr[-2000:]
    else:
        assert_user_error(proc, code, contains=fragment)
    # nothing written outside the (removed) temporary directory
    assert outside_tmp() == before
    left = sorted(p.name for p in tmp.iterdir())
    if code == 1:  # the engines ran (onnxruntime leaves a '.ses' file in TMPDIR): only ours count
        left = [name for name in left if name.startswith("reprokit")]
    assert not left, f"temporary files left: {left}"
    assert not os.path.exists(EVIL_ABS)
    assert not (tmp_path.parent / "evil.txt").exists()


# == 6. a full disk ===========================================================================


def mount_tmpfs(path: Path, size: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot simulate a full disk with a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root/CAP_SYS_ADMIN here: {done.stderr.strip()}")
    return path


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


PACK_DISK_BUG = (
    "reprokit/archive.py:write_archive lets OSError ({err}) escape (so do report.pack's staging "
    "writes): cli.main reports 'Error: internal error: OSError: [Errno {no}] ...' with exit 70 "
    "and the partial {tmp} is left next to the requested archive. Fix: catch OSError in "
    "write_archive, unlink the .tmp, raise a ReprokitError('cannot write the report archive "
    "PATH: <strerror>', hint='free disk space or choose another -o') with exit 4 (environment)")


def test_pack_onto_a_full_disk_is_a_clear_error(tmp_path):
    model = save(scale_model(), tmp_path / "tiny.onnx")
    disk = mount_tmpfs(tmp_path / "disk", "64k")
    try:
        fill_disk(disk)
        proc = reprokit("pack", model, "--target", "emulate:fp16", "-o", disk / "report.tar.gz",
                        cwd=tmp_path)
        left = sorted(p.name for p in disk.iterdir())
    finally:
        unmount(disk)
    assert_disk_error(proc)
    assert left == ["filler"], f"partial output left on the full disk: {left}"


def _file_size_limit(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_pack_past_the_file_size_limit_is_a_clear_error(tmp_path):
    """No root needed: RLIMIT_FSIZE of 160 KiB lets every file of the run through (the largest,
    inputs.json, is ~88 KiB) except the ~250 KiB archive."""
    model = save(scale_model(16_384), tmp_path / "wide.onnx")
    out = tmp_path / "out"
    out.mkdir()
    proc = reprokit("pack", model, "--target", "emulate:fp16", "-o", out / "report.tar.gz",
                    cwd=tmp_path, preexec_fn=_file_size_limit(160 << 10))
    assert_disk_error(proc)
    assert not list(out.iterdir()), f"partial output left: {list(out.iterdir())}"


SOFTMAX_FAILS = """
    import sys
    import onnx
    if "Softmax" in [n.op_type for n in onnx.load(sys.argv[1]).graph.node]:
        print("[E] Error Code 2: Internal Error (Softmax)")
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def best_write_fails(tmp_path_factory):
    """A finished shrink of wide_expand_chain, then its --resume under RLIMIT_FSIZE = 512 KiB.
    The resume replays the journal without engine calls and rewrites the best-so-far at every
    accepted step: minimal.onnx stays tiny, but once the cut reaches t0..t3 inputs.npz holds a
    1 MiB activation, and that write fails (EFBIG, as on a full disk or quota)."""
    root = tmp_path_factory.mktemp("hostile-best")
    model = save(wide_expand_chain(), root / "wide.onnx")
    script = write_script(root / "softmax_fails.py", SOFTMAX_FAILS)
    out = root / "out"
    # --no-shrink-shapes: the scenario needs the 1 MiB cut as the node reduction leaves it;
    # --keep-state: the resume replays with the activations captured, no engine call (issue 28 item 7)
    args = ["shrink", model, "--target", cmd_target(script, "{model}"), "-o", out, "--no-pack", "--no-shrink-shapes",
            "--keep-state"]
    first = reprokit(*args, cwd=root, timeout=180)
    assert first.returncode == 0, first.stderr[-3000:]
    with np.load(out / "inputs.npz") as data:
        assert max(data[k].nbytes for k in data.files) > 512 << 10, "the scenario needs a big cut"
    second = reprokit(*args, "--resume", cwd=root, timeout=180, preexec_fn=_file_size_limit(512 << 10))
    assert second.returncode != 0, "the resume wrote a 1 MiB inputs.npz past a 512 KiB limit?"
    return second, out


def test_failed_write_of_the_best_so_far_is_a_clear_error(best_write_fails):
    proc, out = best_write_fails
    assert_disk_error(proc)
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name], sorted(os.listdir(out))


def test_failed_write_of_the_best_so_far_keeps_a_consistent_previous_best(best_write_fails):
    _, out = best_write_fails
    assert_consistent_best(out)


def test_a_capture_that_does_not_fit_is_a_disk_error_not_an_internal_one(tmp_path):
    """Without --keep-state the finished run's activations are gone (issue 28 item 7): the resume
    captures again, and the engine worker's write past RLIMIT_FSIZE (numpy's short write, no
    errno) is exit 4 naming the folder, not exit 70."""
    model = save(wide_expand_chain(), tmp_path / "wide.onnx")
    script = write_script(tmp_path / "softmax_fails.py", SOFTMAX_FAILS)
    args = ["shrink", model, "--target", cmd_target(script, "{model}"), "-o", tmp_path / "out", "--no-pack",
            "--no-shrink-shapes", "--max-calls", "0"]
    first = reprokit(*args, cwd=tmp_path, timeout=180)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    summary["status"] = "interrupted"  # as if stopped before the end: --resume continues, captures again
    (tmp_path / "out" / "summary.json").write_text(json.dumps(summary))
    second = reprokit(*args, "--resume", cwd=tmp_path, timeout=180, preexec_fn=_file_size_limit(512 << 10))
    assert_disk_error(second)
    assert "out/.reprokit" in second.stderr and second.returncode == 4


FILL_WHEN_PACKING = """
    \"\"\"'Error Code 2' for any model holding a Softmax; called from outside OUT (the report's
    final check, after the shrink itself is done) it first fills OUT's disk to the brim.\"\"\"
    import os, sys
    import onnx

    model, out = sys.argv[1:3]
    job = open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode()  # the reprokit worker
    if out not in job and not os.path.exists(os.path.join(out, "filled")):
        open(os.path.join(out, "filled"), "w").close()
        with open(os.path.join(out, "filler"), "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(bytes(1 << 16))
            except OSError:
                pass
    if "Softmax" in [n.op_type for n in onnx.load(model).graph.node]:
        print("[E] Error Code 2: Internal Error (Softmax)")
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def report_disk_full(tmp_path_factory):
    """A shrink on a 32 MiB tmpfs whose disk fills up after the shrink, while the report is
    written (the check command fills it on the report's own check)."""
    root = tmp_path_factory.mktemp("hostile-report")
    # x[1,8] -> Neg -> Softmax -> Abs -> y[1,8]
    model = save(unary_chain(["Neg", "Softmax", "Abs"]), root / "three.onnx")
    script = write_script(root / "fill.py", FILL_WHEN_PACKING)
    out = mount_tmpfs(root / "out", "32m")
    try:
        proc = reprokit("shrink", model, "--target", cmd_target(script, "{model}", str(out)),
                        "-o", out, cwd=root, timeout=180)
        state = root / "state"
        shutil.copytree(out, state, ignore=shutil.ignore_patterns("filler", ".reprokit"))
    finally:
        unmount(out)
    assert (state / "filled").exists(), "the check command never filled the disk"
    assert proc.returncode != 0, "the shrink wrote its report onto a full disk?"
    return proc, state


def test_disk_full_while_writing_the_report_is_a_clear_error(report_disk_full):
    proc, state = report_disk_full
    assert_disk_error(proc)
    assert not [p.name for p in state.iterdir() if p.name.startswith("report.")], os.listdir(state)


def test_disk_full_while_writing_the_report_keeps_the_shrink_result(report_disk_full):
    _, state = report_disk_full
    summary = assert_consistent_best(state, status="done")
    assert summary["minimal"]["ops"] == ["Softmax"]
