"""One matrix cell: a reproducer, run in one version's environment, and its outcome.

A cell gets plain data (Ray ships it; nothing is assumed on a worker but uv and this module):
the script to run and the archive's files it reads, as ``reprokit.report.reproducer.runnable``
chose them on the driver (reprokit's own reproducer unless the user opted in to the archive's
repro.py). The cell reads no archive: the driver extracted and checked it once. It builds or
reuses its environment (``envs``), lays the files out in a fresh folder, runs ``python -I repro.py
--reference recorded`` there (isolated: the folder's own files are never imported, only the
engine under test changes), and words the exit code: 1 with a "REPRODUCES" line reproduces, 0 does
not, 2 diverges differently, 3/4 or a failed environment cannot run, anything else is an error
(an exception in the script is not the bug). A verdict is never guessed. A cell of a CPU engine
runs repro.py under the memory bound of engine workers (``Cell.memory_bound``, the driver's
``--memory-bound``: ``engine/memorybound.py``): an allocation it refused cannot run, no verdict.

A cell's data limit is the bound or a lower one its process inherited (``ulimit -d``), and the
outcome names the one that held; a thread refused by a task limit (``engine/threadlimit.py``) is
said as such, never as memory.

Standard library only (see ``envs``; ``engine.memorybound`` and ``engine.threadlimit`` are).
"""

from __future__ import annotations

import enum
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass

from reprokit.engine import memorybound, threadlimit
from reprokit.matrix.envs import EnvBuildError, EnvRequest, env_in_use, run_process


class Outcome(str, enum.Enum):
    REPRODUCES = "reproduces"
    DOES_NOT = "does not reproduce"
    DIFFERENTLY = "diverges differently"
    CANNOT_RUN = "cannot run"
    ERROR = "error"  # the script failed in a way that is no verdict (an exception, exit 70)

    @property
    def judged(self) -> bool:
        """An outcome about the model (a bisect searches over these; the others are skipped)."""
        return self not in (Outcome.CANNOT_RUN, Outcome.ERROR)


# A verdict needs its exit code AND the line the script prints with it: an uncaught exception
# exits 1 too, argparse's usage error 2, sys.exit() 0.
VERDICT_EXITS = {1: (Outcome.REPRODUCES, ("REPRODUCES",)), 0: (Outcome.DOES_NOT, ("DOES NOT REPRODUCE",)),
                 2: (Outcome.DIFFERENTLY, ("DIVERGES DIFFERENTLY", "DIFFERENT FAILURE"))}
CANNOT_RUN_EXITS = (3, 4)  # a package or a file missing here: no verdict either way
# repro.py under a memory bound: RLIMIT_DATA set in the cell's own interpreter, then the script run
# as its __main__ (argv: -c LIMIT repro.py ARGS...)
# (a lower limit inherited, soft or hard, is kept: engine.memorybound.apply's rule; the thread
# stacks' allowance is added here, where the cell's cores are known: memorybound.stack_allowance)
_BOUNDED = ("import os, resource, runpy, sys\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_DATA)\n"
            "stack = resource.getrlimit(resource.RLIMIT_STACK)[0]\n"
            "stack = 2 << 20 if stack == resource.RLIM_INFINITY else min(stack, 64 << 20)\n"
            "limit = int(sys.argv.pop(1)) + 2 * (os.cpu_count() or 1) * stack\n"
            "limit = min([limit] + [x for x in (soft, hard) if x != resource.RLIM_INFINITY])\n"
            "resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")


@dataclass(frozen=True)
class Cell:
    package: str
    version: str
    requirements: tuple[str, ...]
    resolve_at: str | None = None
    target: str | None = None  # None: the archive's recorded target
    gpu: str | None = None  # the accelerator kind a Ray cell asked for (--gpus)
    timeout: float = 600.0
    needs_gpu: bool = False  # the engine runs on a GPU (TensorRT, CUDA): a Ray cell asks for one
    memory_bound: int | None = None  # bytes repro.py may allocate (CPU engines; engine/memorybound.py)

    @property
    def label(self) -> str:
        return self.version + (f" @ {self.gpu}" if self.gpu else "")


def run_cell(cell: Cell, payload: dict) -> dict:
    """Build/reuse the environment, run ``payload["script"]`` beside ``payload["files"]``, return
    the outcome as plain data."""
    result = {"cell": asdict(cell), "version": cell.version, "gpu": cell.gpu, "host": socket.gethostname(),
              "machine": platform.machine(), "env_seconds": None, "env_built": None, "run_seconds": None,
              "exit_code": None, "packages": {}, "output": ""}
    request = EnvRequest(cell.requirements, cell.resolve_at)
    try:
        with env_in_use(request, timeout=max(cell.timeout, 900.0)) as env:  # `matrix clean` keeps it meanwhile
            result.update(env_seconds=round(env.seconds, 2), env_built=env.built, packages=env.packages,
                          env_path=env.path)
            if env.rebuilt_why:
                result["env_rebuilt"] = env.rebuilt_why
            return _run_script(cell, env, payload, result)
    except EnvBuildError as exc:
        return {**result, "outcome": Outcome.CANNOT_RUN.value, "why": f"environment: {exc}"}


def _run_script(cell: Cell, env, payload: dict, result: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="reprokit-cell-") as tmp:
        top = os.path.join(tmp, "archive")
        _lay_out(top, payload)
        # -I: the folder's files are data, never imported; a fresh pycache folder: no .pyc in the
        # environment is read (envs.intact checks the sources, not compiled files)
        argv = [env.python, "-I", "-X", f"pycache_prefix={os.path.join(tmp, 'pycache')}", "repro.py"]
        if cell.memory_bound:
            argv[-1:] = ["-c", _BOUNDED, str(cell.memory_bound), "repro.py"]
        if "--reference" in payload["script"]:  # archives packed before reprokit had it: run as is
            argv += ["--reference", "recorded"]
        if cell.target:
            argv += ["--target", cell.target]
        started = time.perf_counter()
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        try:
            done = run_process(argv, cwd=top, timeout=cell.timeout, env=clean)
        except EnvBuildError as exc:  # the driver was interrupted before repro.py started
            return {**result, "outcome": Outcome.CANNOT_RUN.value, "why": str(exc)}
        except subprocess.TimeoutExpired:
            return {**result, "run_seconds": round(time.perf_counter() - started, 2),
                    "outcome": Outcome.CANNOT_RUN.value, "why": f"repro.py ran past {cell.timeout:.0f} s"}
    result.update(run_seconds=round(time.perf_counter() - started, 2), exit_code=done.returncode,
                  output=(done.stdout + done.stderr)[-3000:])
    outcome, why = judge_exit(done.returncode, done.stdout, done.stderr, **_held(cell))
    return {**result, "outcome": outcome.value, "why": why}


def _held(cell: Cell) -> dict:
    """The data limit repro.py really ran under: the cell's bound, or a lower limit this process
    inherited (ulimit -d, a container's), which the bound never raises; GPU cells run unbounded
    (engine/memorybound.py says why). ``judge_exit``'s keywords."""
    inherited = None if cell.needs_gpu else memorybound.inherited_limit()
    if inherited is not None and (not cell.memory_bound or inherited < cell.memory_bound):
        return {"bound": inherited, "inherited": True, "configured": cell.memory_bound}
    return {"bound": cell.memory_bound}


def judge_exit(code: int, stdout: str, stderr: str = "", bound: int | None = None, *, inherited: bool = False,
               configured: int | None = None) -> tuple[Outcome, str]:
    """The outcome a reproducer's exit code and output say; only 1 with its REPRODUCES line is
    "reproduces", an unknown code or an exception is an error, never a verdict. A thread that a
    task limit refused, or under a memory ``bound`` an allocation that failed, cannot run: the
    engine did not run the model (an ``inherited`` bound, lower than the ``configured`` one, is
    named as the limit that held)."""
    limit = threadlimit.refused_by_limit(stdout, stderr) if code else None
    if limit:
        return Outcome.CANNOT_RUN, "repro.py " + threadlimit.refused_words(limit, stdout + "\n" + stderr)
    if bound and memorybound.ran_out(stdout, stderr):
        said = memorybound.ran_out_words(bound, stdout + "\n" + stderr, inherited=inherited, configured=configured)
        return Outcome.CANNOT_RUN, "repro.py " + said
    said = _last_verdict_line(stdout)
    if code in VERDICT_EXITS and said.startswith(VERDICT_EXITS[code][1]):
        return VERDICT_EXITS[code][0], said
    if code in CANNOT_RUN_EXITS:
        return Outcome.CANNOT_RUN, said or f"repro.py exited {code} (cannot run here)"
    if code < 0:  # the engine took the process down: its own failure
        return Outcome.DIFFERENTLY, f"repro.py was killed by signal {-code} (the engine crashed)"
    lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
    return Outcome.ERROR, f"repro.py failed (exit {code}, no verdict): " + (lines[-1][:300] if lines else "no output")


def _last_verdict_line(text: str) -> str:
    words = ("REPRODUCES", "DOES NOT REPRODUCE", "DIVERGES DIFFERENTLY", "DIFFERENT FAILURE", "COULD NOT RUN")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(words)]
    return lines[-1] if lines else ""


def _lay_out(top: str, payload: dict) -> None:
    """The files (paths the driver listed from the checked archive: as bytes, or copied from the
    driver's checked folder) and the script, under ``top``."""
    root = os.path.realpath(top)
    names = [rel for rel, _ in payload["files"]] if "files" in payload else payload["names"]
    data = dict(payload["files"]) if "files" in payload else {}
    for rel in [*names, "repro.py"]:
        path = os.path.realpath(os.path.join(root, *rel.split("/")))
        if os.path.commonpath([root, path]) != root:  # the driver never lists one: refuse all the same
            raise ValueError(f"{rel} leaves the cell's folder")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if rel == "repro.py":
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(payload["script"])
        elif rel in data:
            with open(path, "wb") as handle:
                handle.write(data[rel])
        else:
            shutil.copyfile(os.path.join(payload["folder"], *rel.split("/")), path)
