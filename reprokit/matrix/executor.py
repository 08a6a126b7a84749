"""Fan cells out and stream their results back: a local pool, or Ray tasks.

Locally each cell is its own process (uv, then repro.py) driven from a small thread pool. On Ray
(``--ray ADDRESS|auto``, or a cluster this process already joined) each cell is one task: the
script and the archive's files go once into the object store as bytes (a worker needs no shared
filesystem), a cell with a GPU kind asks for
``num_gpus=1, accelerator_type=KIND``, and a kind no node offers is reported as "cannot run"
instead of waiting for ever. The same executor serves ``reprokit check`` over many models
(``fanout``). Results arrive in completion order through ``on_result``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict

import reprokit
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.matrix.cells import Cell, Outcome, run_cell
from reprokit.matrix.envs import EnvBuildError, allow_all, run_process, stop_all

INSTALL = "pip install 'reprokit[matrix]' (Ray and uv)"


def execute(cells: list[Cell], payload: dict, *, ray_address: str | None = None,
            jobs: int = 2, on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every cell on ``payload`` (plain data: the script and files ``reproducer.runnable``
    chose); results in the order of ``cells``."""
    tasks = [(run_cell, (cell, payload), cell.gpu) for cell in cells]
    return _run(tasks, ray_address, jobs, on_result)


def fanout(argvs: list[list[str]], *, ray_address: str | None = None, jobs: int = 2, gpus: list[str] | None = None,
           timeout: float = 3600.0, on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """``reprokit ARGV`` for each argv (one model each), locally or as Ray tasks."""
    kinds = gpus or [None]
    here = os.getcwd()  # relative paths in ARGV (--inputs) mean the same on a worker of this machine
    tasks = [(run_reprokit, (argv, timeout, kind, here), kind) for argv in argvs for kind in kinds]
    return _run(tasks, ray_address, jobs, on_result)


def run_reprokit(argv: list[str], timeout: float, gpu: str | None = None, cwd: str | None = None) -> dict:
    """One ``python -m reprokit ARGV`` in this environment (a Ray worker's, or ours), in the
    driver's folder where this machine has it."""
    started = time.perf_counter()
    if not os.path.isfile(argv[1]):  # paths travel, not bytes: a worker sees only its own files
        return {"argv": argv, "gpu": gpu, "exit_code": None, "stdout": "", "seconds": 0.0, "host": os.uname().nodename,
                "stderr": f"Error: {argv[1]} is not on {os.uname().nodename}: check --ray needs the models on a "
                          "filesystem every node shares (the same path on each)"}
    try:
        done = run_process([sys.executable, "-m", "reprokit", *argv], timeout=timeout,
                           cwd=cwd if cwd and os.path.isdir(cwd) else None)
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, out, err = None, "", f"ran past {timeout:.0f} s"
    except EnvBuildError:  # the driver was interrupted before this one started
        code, out, err = None, "", "interrupted"
    return {"argv": argv, "gpu": gpu, "exit_code": code, "stdout": out, "stderr": err[-3000:],
            "seconds": round(time.perf_counter() - started, 2), "host": os.uname().nodename}


def _run(tasks, ray_address, jobs, on_result) -> list[dict]:
    report = on_result or (lambda result: None)
    if ray_address is not None:
        return _on_ray(tasks, ray_address, report)
    results: list[dict | None] = [None] * len(tasks)
    allow_all()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    with interrupts_at_checkpoints() as interrupted:
        try:
            futures = {pool.submit(fn, *args): i for i, (fn, args, _) in enumerate(tasks)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in done:
                    if interrupted.is_set():
                        break
                    results[futures[future]] = future.result()
                    report(results[futures[future]])
                if interrupted.is_set():
                    raise KeyboardInterrupt
        except BaseException:  # Ctrl-C/SIGTERM: queued cells never start, running processes are killed
            stop_all()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    pool.shutdown()
    return results  # type: ignore[return-value]


@contextlib.contextmanager
def interrupts_at_checkpoints():
    """While cells run, Ctrl-C and SIGTERM only set the event yielded; the waiting loop raises
    KeyboardInterrupt where it holds no lock (an interrupt raised inside a ``with lock:`` of the
    pool or the console ended in "release unlocked lock", exit 70). Outside the main thread
    nothing changes (signals reach only the main thread)."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    old = {number: signal.signal(number, lambda signum, frame: interrupted.set())
           for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interrupted
    finally:
        for number, handler in old.items():
            signal.signal(number, handler)


def _on_ray(tasks, address: str, report) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise EngineUnavailable("--ray needs Ray, which is not installed here", hint=INSTALL) from None
    if not ray.is_initialized():
        ray_reachable(address)
        try:
            ray.init(address=None if address == "local" else address, log_to_driver=False,
                     runtime_env=_runtime_env(address))
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise EngineUnavailable(f"cannot join the Ray cluster at {address!r}: {str(exc).splitlines()[0]}",
                                    hint="start one (ray start --head), give its address, or use --ray local "
                                         "for a cluster on this machine") from exc
    offered = ray.cluster_resources()
    results: list[dict | None] = [None] * len(tasks)
    refs = {}
    shipped = {}
    remotes = {}
    for index, (fn, args, kind) in enumerate(tasks):
        if kind and f"accelerator_type:{kind}" not in offered:
            results[index] = _no_such_kind(fn, args, kind, offered)
            report(results[index])
            continue
        if not kind and fn is run_cell and args[0].needs_gpu and not offered.get("GPU"):
            results[index] = _failed(fn, args, kind, "the target runs on a GPU and no node of the cluster offers one")
            report(results[index])
            continue
        if fn is run_cell:  # the files once into the object store, shared by every cell
            key = id(args[1])
            if key not in shipped:
                shipped[key] = ray.put(args[1])
            args = (args[0], shipped[key])
        options = {"num_cpus": 1, "max_retries": 0}
        if kind:
            options.update(num_gpus=1, accelerator_type=kind)
        elif fn is run_cell and args[0].needs_gpu:  # without --gpus: any GPU, but one of its own
            options.update(num_gpus=1)
        if fn not in remotes:  # one remote function per kind of task, exported to the cluster once
            remotes[fn] = ray.remote(fn)
        refs[remotes[fn].options(**options).remote(*args)] = index
    pending = list(refs)
    with interrupts_at_checkpoints() as interrupted:
        try:
            _gather(ray, tasks, refs, pending, results, report, interrupted)
        except BaseException:  # Ctrl-C/SIGTERM: the cluster's tasks of this run are cancelled
            for ref in refs:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - already finished or gone: nothing to cancel
                    pass
            raise
    return results  # type: ignore[return-value]


def _gather(ray, tasks, refs, pending, results, report, interrupted) -> None:
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=0.2)
        if interrupted.is_set():
            raise KeyboardInterrupt
        if not done:
            continue
        try:
            result = ray.get(done[0])
        except Exception as exc:  # the task itself died (worker lost, OOM): that cell cannot run
            fn, args, kind = tasks[refs[done[0]]]
            result = _failed(fn, args, kind, f"the Ray task failed: {type(exc).__name__}: {str(exc)[:300]}")
        results[refs[done[0]]] = result
        report(result)


def ray_reachable(address: str, timeout: float = 10.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) nobody listens on is an error at once: ray.init would
    retry for minutes, printing its own log lines."""
    if address in ("auto", "local"):
        return
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address.strip())
    if match is None:
        raise UsageError(f"--ray {address!r} is not an address", hint="auto, local, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((match.group(1), int(match.group(2))), timeout=timeout).close()
    except OSError as exc:
        raise EngineUnavailable(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc}",
                                hint="start one (ray start --head), give its address, or use --ray local "
                                     "for a cluster on this machine") from None


def _runtime_env(address: str) -> dict | None:
    """A cluster joined by address gets reprokit's own files (py_modules) and uv: the matrix cells
    need nothing else on a worker, they build their environments there. ``local`` starts a
    cluster that shares this interpreter."""
    if address == "local":
        return None
    return {"py_modules": [os.path.dirname(reprokit.__file__)], "pip": ["uv"]}


def _no_such_kind(fn, args, kind, offered) -> dict:
    kinds = sorted(k.split(":", 1)[1] for k in offered if k.startswith("accelerator_type:"))
    return _failed(fn, args, kind, f"no node of the cluster offers accelerator_type {kind} "
                                   f"(kinds here: {', '.join(kinds) or 'none'})")


def _failed(fn, args, kind, why: str) -> dict:
    if fn is run_cell:
        cell = args[0]
        return {"cell": asdict(cell), "version": cell.version, "gpu": kind,
                "outcome": Outcome.CANNOT_RUN.value, "why": why, "env_seconds": None, "run_seconds": None,
                "exit_code": None, "packages": {}, "output": ""}
    return {"argv": args[0], "gpu": kind, "exit_code": None, "stdout": "", "stderr": why, "seconds": None,
            "host": None}
