"""Run one backend call in a child process: timeout, process-group kill, crash → result. A check
command (``cmd:``) is a process of its own already: its call runs here, the command in its own
process group (``_run_inline``).

The parent side (:func:`run_in_worker`) never imports an engine. The child side
(``python -m reprokit.engine.worker JOB_DIR``) builds the backend, runs it and writes ``result.json``
plus every output in ONE file (``engine/tensorfile.py``: a survey pack's thousands of outputs are
one file, not one ``.npy`` each), so big outputs cross the process boundary through the disk and
are read back memory-mapped. A worker of a CPU engine runs under a memory bound
(``engine/memorybound.py``); an allocation it refused comes back as status ``memory``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from reprokit.engine import enginelog, lifeline, memorybound, threadlimit
from reprokit.engine.backends import create_backend
from reprokit.engine.backends.base import BuildError
from reprokit.engine.backends.cmd import CmdBackend, CommandCrash, CommandTimeout, call
from reprokit.engine.tensorfile import Entry, Tensors, load_job_feeds, write_tensors
from reprokit.errors import EngineUnavailable, ExitCode, ReprokitError
from reprokit.files import read_json
from reprokit.graph.io import external_locations, stage_external_data
from reprokit.spec import parse_target
from reprokit.standalone.arrays import restored
from reprokit.standalone.checkpolicy import CheckPolicy

_STDERR_TAIL = 4000
_RUNNING: set = set()  # live engine processes, so an interrupt can kill them from any thread
_RUNNING_LOCK = threading.Lock()


def kill_running() -> None:
    """Kill the process group of every engine call in flight (used on interrupts)."""
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def load_npy(path: str, note: str | None = None) -> np.ndarray:
    """A .npy written by an engine call, memory-mapped; ``note`` is the dtype note
    ``arrays.storable`` gave it (an ml_dtype saved as raw bits, strings)."""
    return restored(np.load(path, mmap_mode="r", allow_pickle=False), note)


OUTPUTS_FILE = "outputs.bin"  # every output of one call (engine/tensorfile.py)


@dataclass
class WorkerResult:
    """What one engine call produced. ``status``: ok, build-error, unavailable, crash, timeout,
    memory (an allocation failed at the worker's memory bound: ``meta["bound"]`` bytes), error (an
    input/usage problem found inside the worker)."""

    status: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    message: str = ""
    hint: str | None = None
    log: str = ""
    seconds: float = 0.0
    exit_code: int | None = None  # ReprokitError exit code for status "error"/"unavailable"
    job_dir: str = ""  # the call's folder (feeds, outputs, logs), set for every status: discard() frees it

    def discard(self) -> None:
        """Free the disk the call used, once its outputs are no longer needed."""
        self.outputs = {}
        if self.job_dir:
            shutil.rmtree(self.job_dir, ignore_errors=True)


def run_in_worker(
    spec: str,
    model_path: str,
    feeds_path: str,
    job_dir: str,
    *,
    output_names: list[str] | None = None,
    timeout: float = 600.0,
    policy: dict | None = None,
    env: dict[str, str] | None = None,
    build_only: bool = False,
    weights_dir: str | None = None,
) -> WorkerResult:
    """Run ``spec`` on a model in a fresh process; never raises for engine failures."""
    os.makedirs(job_dir, exist_ok=True)
    engine = spec.split(":", 1)[0].strip()
    job = {
        "spec": spec,
        "model": os.path.abspath(model_path),
        "feeds": os.path.abspath(feeds_path),
        "outputs": output_names,
        "check_policy": policy,
        "build_only": build_only,
        "weights_dir": os.path.abspath(weights_dir) if weights_dir else None,
        "memory_bound": _bound_for(spec),
        "on_gpu": _bound_for(spec, gpu=True),  # its out-of-memory words may be the GPU's (ran_out_words)
        "parent": os.getpid(),  # the worker dies with this process (engine/lifeline.py)
    }
    with open(os.path.join(job_dir, "job.json"), "w") as handle:
        json.dump(job, handle)
    stderr_path = os.path.join(job_dir, "stderr.log")
    start = time.monotonic()
    if engine == "cmd":  # not parsed here: a bad spec is the job's result, as in a worker
        return _run_inline(job, job_dir, stderr_path, timeout, dict(os.environ, **(env or {})))
    label = f"{spec} on {os.path.basename(model_path)} ({os.path.basename(job_dir)})"
    code = _run_child(job_dir, stderr_path, timeout, dict(os.environ, **(env or {})), label)
    seconds = time.monotonic() - start
    if code is None:
        return WorkerResult("timeout", message=f"no answer within {timeout:g} s; the process group was killed",
                            log=_tail(stderr_path), seconds=seconds, job_dir=job_dir)
    return _read_result(job_dir, code, stderr_path, seconds, job["memory_bound"], job["on_gpu"])


def _bound_for(spec: str, gpu: bool = False):
    """The memory bound of a worker for ``spec``: None for check commands (a spec that does not
    parse is the job's result, said by the child); with ``gpu``, whether it runs on the GPU."""
    try:
        parsed = parse_target(spec)
    except ReprokitError:
        return False if gpu else None
    return memorybound.on_gpu(parsed) if gpu else memorybound.bound_for(parsed, memorybound.configured())


def _run_inline(job: dict, job_dir: str, stderr_path: str, timeout: float, env: dict) -> WorkerResult:
    """A check command's call without a worker process of its own: the command is a process
    already, and the backend around it is reprokit's own code (it saves the feeds, runs the
    command, reads its outputs), which no engine can crash. A worker's interpreter and imports
    cost about as much as a small check (0.4-0.9 s a call on a loaded 2-core machine, issue 39).
    The command still runs in a process group of its own, killed at the timeout or on an
    interrupt (``kill_running``), and its result crosses the same files as a worker's."""
    start = time.monotonic()

    def launch(argv: list[str], out, err) -> int:
        code = _waited(argv, out, err, env, timeout)
        if code is None:
            raise CommandTimeout(f"no answer within {timeout:g} s; the process group was killed")
        return code

    _write_result(job_dir, _run_job(job, job_dir, launch))
    return _read_result(job_dir, 0, stderr_path, time.monotonic() - start)


def _run_child(job_dir: str, stderr_path: str, timeout: float, env: dict, label: str) -> int | None:
    """The child's exit code; None when it ran past ``timeout`` (its process group killed)."""
    with open(stderr_path, "wb") as err:
        try:
            return _waited([sys.executable, "-m", "reprokit.engine.worker", job_dir], err, subprocess.STDOUT, env,
                           timeout)
        finally:
            # The engine's own lines (onnxruntime, OpenVINO, polygraphy) go to the run's log,
            # never to the console (reprokit.engine.enginelog).
            enginelog.record_file(label, stderr_path)


def _waited(argv: list[str], out, err, env: dict, timeout: float) -> int | None:
    """Start ``argv`` in a process group of its own (a kill takes its children too), known to
    ``kill_running`` while it runs; its exit code, or None past ``timeout`` (the group killed).
    Waited for blocking, with a timer that kills the group at the timeout: ``Popen.wait(timeout)``
    polls with sleeps of up to 50 ms, so each call's end was seen about 25 ms late (issue 39: a
    pass/fail run of 8 small calls lost ~0.2 s to it)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True, env=env)
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _signal_group(proc)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        code = proc.wait()
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        timer.cancel()
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    return None if expired.is_set() and code == -signal.SIGKILL else code  # not one that ended just then


def _read_result(job_dir: str, code: int, stderr_path: str, seconds: float, bound: int | None = None,
                 gpu: bool = False) -> WorkerResult:
    """The child's result.json as a WorkerResult; a crash when it died without writing one (at
    its memory bound ``bound`` when its last words say an allocation failed: an engine that aborts
    on std::bad_alloc)."""
    result_path = os.path.join(job_dir, "result.json")
    if code != 0 or not os.path.exists(result_path):
        log = _tail(stderr_path)
        limit = threadlimit.refused_by_limit(log) if code != -signal.SIGKILL else None
        if limit:  # an engine that aborts when a thread cannot start (std::system_error)
            return WorkerResult("unavailable", message=threadlimit.refused_words(limit, log), hint=threadlimit.HINT,
                                log=log, seconds=seconds, exit_code=int(ExitCode.ENVIRONMENT), job_dir=job_dir)
        if bound and code != -signal.SIGKILL and memorybound.ran_out(log):
            return WorkerResult("memory", meta={"bound": bound}, message=memorybound.ran_out_words(bound, _last_line(log), gpu=gpu),
                                log=log, seconds=seconds, job_dir=job_dir)
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (out of memory?)" if name == "SIGKILL" else ""
            message = f"engine process killed by {name}{hint}"
        else:
            message = f"engine process exited with code {code} without a result"
        return WorkerResult("crash", message=message, log=_tail(stderr_path), seconds=seconds, job_dir=job_dir)
    try:
        result = read_json(result_path)
    except ValueError as exc:  # reprokit's own child wrote it: unreadable is a crash, not the user's input
        return WorkerResult("crash", message=f"engine process left an unreadable result ({exc})",
                            log=_tail(stderr_path), seconds=seconds, job_dir=job_dir)
    outputs = Tensors(os.path.join(job_dir, OUTPUTS_FILE),
                      {entry["name"]: Entry.from_json(entry) for entry in result.get("outputs", [])})
    return WorkerResult(
        result["status"],
        outputs=outputs,
        meta=result.get("meta", {}),
        message=result.get("message", ""),
        hint=result.get("hint"),
        log=result.get("log", "") or _tail(stderr_path),
        seconds=seconds,
        exit_code=result.get("exit_code"),
        job_dir=job_dir,
    )


def _signal_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    _signal_group(proc)
    proc.wait()


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _STDERR_TAIL))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return _whole_lines(tail) if size > _STDERR_TAIL else tail


def _whole_lines(tail: str) -> str:
    """A log's tail without its first, cut line, so that no quote of it starts mid-word."""
    return tail.split("\n", 1)[1] if "\n" in tail else tail


def _child(job_dir: str) -> int:
    """Child side: bound its memory, run the job, write result.json. Engine crashes kill this
    process, by design; an allocation refused at the bound is status "memory"."""
    job = read_json(os.path.join(job_dir, "job.json"))
    lifeline.tie_to_parent(job.get("parent"))
    bound = job.get("memory_bound")
    if bound:
        bound = memorybound.apply(bound)  # a lower limit the worker inherited is the one that holds
    result = _run_job(job, job_dir)
    failed = result["status"] in ("build-error", "error", "crash")
    words = (result.get("message", ""), str(result.get("meta", {}).get("detail", "")))
    limit = threadlimit.refused_by_limit(*words) if failed else None  # asked while this process lives
    if limit:  # a thread refused by a task limit: no verdict, and no memory either
        result = {"status": "unavailable", "message": threadlimit.refused_words(limit, "\n".join(words)),
                  "hint": threadlimit.HINT, "exit_code": int(ExitCode.ENVIRONMENT), "log": result.get("log", "")}
    elif bound and failed and memorybound.ran_out(*words):
        result = {"status": "memory", "message": memorybound.ran_out_words(bound, result.get("message", ""),
                                                                                  gpu=bool(job.get("on_gpu"))),
                  "meta": {"bound": bound}, "log": result.get("log", "")}
    _write_result(job_dir, result)
    return 0


def _last_line(log: str) -> str:
    lines = [line for line in log.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _write_result(job_dir: str, result: dict) -> None:
    tmp = os.path.join(job_dir, "result.json.tmp")
    with open(tmp, "w") as handle:
        json.dump(result, handle, default=str)
    os.replace(tmp, os.path.join(job_dir, "result.json"))


def _run_job(job: dict, job_dir: str, launch=call) -> dict:
    """Run one job (``launch``: how a check command is started); its result as result.json holds it."""
    result: dict = {"status": "ok"}
    try:
        spec = parse_target(job["spec"])
        backend = (CmdBackend(spec, CheckPolicy.from_json(job.get("check_policy")), launch) if spec.engine == "cmd"
                   else create_backend(spec))
        backend.build_only = bool(job.get("build_only"))
        model_path = _place_weights(backend, job["model"], job.get("weights_dir"), job_dir)
        feeds = load_job_feeds(job["feeds"])
        try:
            run = backend.run(model_path, feeds, job["outputs"])
        finally:
            shutil.rmtree(os.path.join(job_dir, "staged"), ignore_errors=True)
        written = write_tensors(os.path.join(job_dir, OUTPUTS_FILE), _tensors(run.outputs))
        entries = [{"name": name, **entry.to_json()} for name, entry in written.items()]
        result.update(outputs=entries, meta=run.meta, log=run.log if len(run.log) <= _STDERR_TAIL else _whole_lines(run.log[-_STDERR_TAIL:]))
    except CommandCrash as exc:
        result = {"status": "crash", "message": exc.message, "meta": {"signal": exc.signal_name}}
    except CommandTimeout as exc:
        result = {"status": "timeout", "message": exc.message}
    except BuildError as exc:
        result = {"status": "build-error", "message": exc.message, "meta": {"detail": exc.detail}}
    except EngineUnavailable as exc:
        result = {"status": "unavailable", "message": exc.message, "hint": exc.hint, "exit_code": int(exc.exit_code)}
    except ReprokitError as exc:
        result = {"status": "error", "message": exc.message, "hint": exc.hint, "exit_code": int(exc.exit_code)}
    except Exception as exc:  # a Python error in reprokit's worker code is not the engine's fault
        import traceback

        if _disk_full(exc):  # the outputs did not fit on the disk: the user's environment, exit 4
            result = {"status": "error", "exit_code": 4,
                      "message": f"cannot write the engine's outputs in {job_dir}: {exc} (disk full or file size limit)",
                      "hint": "free disk space or write elsewhere (-o); results already written are kept"}
        else:

            # The traceback travels as the log: the parent chains it to its error for --debug only.
            result = {"status": "error",
                      "message": f"internal error in the engine worker: {exc.__class__.__name__}: {exc}",
                      "hint": "rerun with --debug and report the traceback", "log": traceback.format_exc(),
                      "exit_code": 70}
    return result


def _disk_full(exc: BaseException) -> bool:
    """A write that did not fit: ENOSPC/EFBIG/EDQUOT, or numpy's own short-write OSError
    ("262144 requested and 131040 written"), which carries no errno."""
    return isinstance(exc, OSError) and (exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
                                         or re.fullmatch(r"\d+ requested and \d+ written", str(exc)) is not None)


def _tensors(outputs: Mapping):
    """Outputs as (name, tensor) pairs: a sequence output (onnxruntime returns a list) becomes one
    output per element, ``name[i]``, since its tensors may differ in shape and cannot form one
    array. An empty optional (None) holds no tensor: it is left out, as a value nothing can be
    compared to. Each value is read only when its turn comes: a backend whose outputs copy out
    of the engine on reading (OpenVINO) then holds one copy at a time."""
    for name in outputs:
        value = outputs[name]
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            yield from ((f"{name}[{i}]", item) for i, item in enumerate(value))
        else:
            yield name, value


def _place_weights(backend, model_path: str, weights_dir: str | None, job_dir: str) -> str:
    """Tell the backend where external weights are, or stage links beside a copy of the model
    file for engines that look only next to it. Returns the model path to run."""
    here = os.path.dirname(os.path.abspath(model_path))
    if not weights_dir or os.path.abspath(weights_dir) == here:
        return model_path
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    locations = external_locations(model)
    if not locations or all(os.path.exists(os.path.join(here, loc)) for loc in locations):
        return model_path  # no external data, or its own beside it (a self-contained save past 2 GB)
    if backend.reads_weights_dir:
        backend.weights_dir = weights_dir
        return model_path
    staged = os.path.join(job_dir, "staged")
    os.makedirs(staged, exist_ok=True)
    stage_external_data(model, weights_dir, staged)
    target = os.path.join(staged, os.path.basename(model_path))
    shutil.copyfile(model_path, target)
    return target


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
