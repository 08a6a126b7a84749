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
import sys
import time

import pytest
from conftest import assert_user_error, extract_data, reprokit_exe, run_cli
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


class Lines:
    """A running command's stderr lines, read as they come (a thread), to act at a known step."""

    def __init__(self, proc):
        import threading

        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc) -> None:
        for line in proc.stderr:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def text(self) -> str:
        self.thread.join(timeout=60)
        return "".join(self.lines)


def test_a_shrink_interrupted_while_packing_is_packed_by_resume(tmp_path):
    save(planted_overflow(), tmp_path / "planted.onnx")
    proc = start("shrink", "planted.onnx", "-t", "emulate:fp16", "-o", "out", cwd=tmp_path)
    lines = Lines(proc)
    try:
        wait_for(proc, lambda: lines.saw("packing the report archive"), "the pack step")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 130, err
    out = tmp_path / "out"
    assert not (out / "report.tar.gz").exists()
    searched = json.loads((out / "summary.json").read_text())
    assert searched["status"] == "done"
    assert "reprokit shrink --resume out" in err

    resumed = run_cli("shrink", "--resume", "out", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "report.tar.gz").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["report"].endswith("report.tar.gz") and summary["report_reproduces"] is True
    assert summary["calls"] == searched["calls"]  # the search was not run again
    verified = run_cli("verify", str(out / "report.tar.gz"), cwd=tmp_path)
    assert verified.returncode == 1, verified.stderr[-3000:]  # 1: the archive reproduces here
    again = run_cli("shrink", "--resume", "out", cwd=tmp_path)
    assert again.returncode == 0 and "finished run" in again.stderr, again.stderr


def test_resume_refuses_a_model_whose_external_data_changed(tmp_path):
    # planted_overflow, its weights in w.bin; the budget stops the run before its answer
    from models import save_external

    save_external(planted_overflow(), tmp_path / "ext.onnx", location="w.bin")
    args = (
        "shrink",
        "ext.onnx",
        "-t",
        "emulate:fp16",
        "--no-pack",
        "--max-calls",
        "2",
        "-o",
        "out",
    )
    first = run_cli(*args, cwd=tmp_path, timeout=300)
    assert first.returncode == 8, first.stderr[-3000:]  # stopped at the budget: --resume continues
    weights = bytearray((tmp_path / "w.bin").read_bytes())
    weights[:4] = bytes(4)  # one weight becomes 0.0: the .onnx file itself is unchanged
    (tmp_path / "w.bin").write_bytes(bytes(weights))
    resumed = run_cli("shrink", "--resume", "out", "--max-calls", "0", cwd=tmp_path, timeout=300)
    assert_user_error(resumed, 3, contains="changed on disk", hint_contains="another -o")
    assert "external data" in resumed.stderr


def test_an_interrupt_while_onnxruntime_loads_is_exit_130(tmp_path):
    # Ctrl-C that lands while onnxruntime's extension module initialises comes out of the import
    # as "ImportError: initialization failed" (exit 70 at 21297fd). The signal is sent the moment
    # the extension is mapped into the process (its dlopen, then its init): a few tries, since
    # that window is the loader's, not ours; every one must end as a clean interrupt.
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/PID/maps to see when onnxruntime's extension is loaded (Linux)")
    save(planted_overflow(), tmp_path / "planted.onnx")
    for attempt in range(3):
        proc = start(
            "shrink", "planted.onnx", "-t", "emulate:fp16", "-o", f"out{attempt}", cwd=tmp_path
        )
        try:
            deadline = time.monotonic() + 120
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with open(f"/proc/{proc.pid}/maps") as handle:
                        if "onnxruntime_pybind11_state" in handle.read():
                            break
                except OSError:
                    pass
            assert proc.poll() is None, "shrink ended before onnxruntime was loaded"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, f"try {attempt}: exit {proc.returncode}\n{err[-2000:]}"
        assert "Traceback" not in err
        assert [line for line in err.splitlines() if line.startswith("Error:")] == [
            "Error: interrupted"
        ], err


# -- string inputs ---------------------------------------------------------------------------


def string_passthrough():
    """s[3] string -> Identity -> su (string output); x[1,16] -> MatMul(W = 3e4) -> y: inf in fp16."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["s"], ["su"], name="pass"),
            helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
        ],
        "strings",
        [
            helper.make_tensor_value_info("s", TensorProto.STRING, [3]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
        ],
        [
            helper.make_tensor_value_info("su", TensorProto.STRING, [3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16]),
        ],
        [numpy_helper.from_array(np.full((16, 16), 3e4, np.float32), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def parsed_strings():
    """s[1,16] string -> Cast(float) "parse" -> MatMul(W = 3e4) "mm" -> y (inf in fp16) -> Relu -> z."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="parse"),
            helper.make_node("MatMul", ["sf", "W"], ["y"], name="mm"),
            helper.make_node("Relu", ["y"], ["z"], name="relu"),
        ],
        "parsed",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [1, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.full((16, 16), 3e4, np.float32), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_check_makes_string_feeds_and_compares_string_outputs_exactly(tmp_path):
    save(string_passthrough(), tmp_path / "strings.onnx")
    proc = run_cli("check", "strings.onnx", "-t", "emulate:fp16", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]  # 1: diverges (y), not 70
    outputs = {o["name"]: o for o in json.loads(proc.stdout)["verdict"]["outputs"]}
    assert (
        outputs["su"]["exact"] and not outputs["su"]["exceeds"]
    )  # the strings agree, element by element
    assert outputs["y"]["exceeds"]


def test_string_inputs_go_through_shrink_the_archive_and_verify(tmp_path):
    import numpy as np

    save(parsed_strings(), tmp_path / "parsed.onnx")
    # np.savez keeps str arrays as fixed-width unicode (<U4): the model's STRING input takes them
    np.savez(tmp_path / "feeds.npz", s=np.array([[f"0.{i + 1}" for i in range(16)]]))
    proc = run_cli("shrink", "parsed.onnx", "-t", "emulate:fp16", "--inputs", "feeds.npz",
                   "--no-reduce-inputs", "-o", "out", cwd=tmp_path, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["report_reproduces"] is True
    assert [i["name"] for i in summary["minimal"]["inputs"]] == ["s"]
    verified = run_cli("verify", "out/report.tar.gz", cwd=tmp_path)
    assert verified.returncode == 1, verified.stderr[
        -3000:
    ]  # reproduces from the archive's string inputs


def test_a_wrong_dtype_hint_names_a_call_that_exists(tmp_path):
    import numpy as np

    save(string_passthrough(), tmp_path / "strings.onnx")
    np.savez(tmp_path / "ints.npz", s=np.arange(3), x=np.zeros((1, 16), np.float32))
    proc = run_cli(
        "check", "strings.onnx", "-t", "emulate:fp16", "--inputs", "ints.npz", cwd=tmp_path
    )
    _, hint = assert_user_error(proc, 3, contains="expects object")
    call = hint.split("e.g. ", 1)[1].split(" (", 1)[0]
    converted = eval(call, {"np": np, "array": np.arange(3)})  # the hint's own words, run as given
    assert converted.dtype == object


# -- models past protobuf's 2 GB ------------------------------------------------------------


def test_a_model_past_the_2gb_line_travels_with_its_external_data(tmp_path):
    # x[1,64] -> MatMul(W[64,64] in [2e4, 3e4]) -> y: inf in fp16. REPROKIT_LARGE_MODEL_BYTES moves
    # the 2 GB line to 1000 bytes: the same code path as a real 2.2 GB model (run by hand in
    # bench/bench_big_pack.py, numbers in docs/archive.md), on a model CI can afford.
    import tarfile

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).uniform(2e4, 3e4, (64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(weights, "W")],
    )
    save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
        tmp_path / "m.onnx",
    )
    packed = run_cli("pack", "m.onnx", "-t", "emulate:fp16", "-o", "report.tar.gz", cwd=tmp_path,
                     env={"REPROKIT_LARGE_MODEL_BYTES": "1000"}, timeout=300)  # fmt: skip
    assert packed.returncode == 0, packed.stderr[-3000:]  # 0: its own repro.py reproduced
    with tarfile.open(tmp_path / "report.tar.gz") as tar:
        extract_data(tar, tmp_path / "x")
    (folder,) = (tmp_path / "x").iterdir()
    assert (folder / "model.onnx.data").stat().st_size == weights.nbytes
    assert (folder / "model.onnx").stat().st_size < 1000  # the weights are not inline
    env = {k: v for k, v in os.environ.items() if k != "REPROKIT_LARGE_MODEL_BYTES"}
    repro = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                           env=env, timeout=300)  # fmt: skip
    assert repro.returncode == 1, repro.stdout + repro.stderr  # 1: reproduces
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".emulated")) == []
    verified = run_cli("verify", "report.tar.gz", cwd=tmp_path)
    assert verified.returncode == 1, verified.stderr[-3000:]


def test_resume_reads_back_the_calls_made_before_the_interrupt(tmp_path):
    # if_loop_fault (tests/shrink_models.py): an If and a Loop reading outer tensors, the fp16
    # overflow in the MatMul after them. Its run confirms the original and checks the opened
    # control flow (two calls of their own) before the survey journals its candidates.
    import shrink_models as sm

    sm.save(sm.if_loop_fault(), tmp_path / "cf.onnx")
    args = ("shrink", "cf.onnx", "-t", "emulate:fp16", "--no-pack")
    full = run_cli(*args, "-o", "full", cwd=tmp_path, timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    uninterrupted = json.loads((tmp_path / "full" / "summary.json").read_text())["calls"]["target"]

    journal = tmp_path / "out" / ".reprokit" / "journal.jsonl"
    proc = start(*args, "-o", "out", cwd=tmp_path)
    try:
        wait_for(
            proc,
            lambda: journal.exists() and journal.read_text().strip(),
            "the survey's first outcome",
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    before = json.loads((tmp_path / "out" / "summary.json").read_text())["calls"]["target"]
    assert before >= 2  # the confirming call and the control-flow check were made

    resumed = run_cli("shrink", "--resume", "out", cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    calls = json.loads((tmp_path / "out" / "summary.json").read_text())["calls"]
    # every call that ended before the interrupt is read back: at most the one in flight is made
    # again (21297fd made the confirming call and the control-flow check again: 3 calls more)
    assert calls["target"] == before + calls["this_process"]
    assert calls["target"] <= uninterrupted + 1, (calls, uninterrupted, before)
    assert calls["cached"] >= 2, calls
