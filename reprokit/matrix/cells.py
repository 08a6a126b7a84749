"""One matrix cell: an archive's repro.py, run in one version's environment, and its outcome.

A cell gets the archive as bytes (Ray ships them; nothing is assumed on a worker but uv and this
module), builds or reuses its environment (``envs``), runs ``python repro.py --reference
recorded`` there (the target at this version against the reference outputs packed in the archive,
so only the engine under test changes), and words repro.py's exit code: 1 reproduces, 0 does not,
2 diverges differently, 3/4 or a failed environment cannot run. A verdict is never guessed: a
cell that could not compare says so.

Standard library only (see ``envs``).
"""

from __future__ import annotations

import enum
import io
import os
import platform
import socket
import subprocess
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass

from reprokit.matrix.envs import EnvBuildError, EnvRequest, ensure_env, run_process


class Outcome(str, enum.Enum):
    REPRODUCES = "reproduces"
    DOES_NOT = "does not reproduce"
    DIFFERENTLY = "diverges differently"
    CANNOT_RUN = "cannot run"


EXIT_OUTCOMES = {1: Outcome.REPRODUCES, 0: Outcome.DOES_NOT, 2: Outcome.DIFFERENTLY,
                 3: Outcome.CANNOT_RUN, 4: Outcome.CANNOT_RUN}


@dataclass(frozen=True)
class Cell:
    package: str
    version: str
    requirements: tuple[str, ...]
    resolve_at: str | None = None
    target: str | None = None  # None: the archive's recorded target
    gpu: str | None = None  # the accelerator kind a Ray cell asked for (--gpus)
    timeout: float = 600.0

    @property
    def label(self) -> str:
        return self.version + (f" @ {self.gpu}" if self.gpu else "")


def run_cell(cell: Cell, archive: bytes, archive_name: str) -> dict:
    """Build/reuse the environment, run repro.py, return the outcome as plain data."""
    result = {"cell": asdict(cell), "version": cell.version, "gpu": cell.gpu, "host": socket.gethostname(),
              "machine": platform.machine(), "env_seconds": None, "env_built": None, "run_seconds": None,
              "exit_code": None, "packages": {}, "output": ""}
    try:
        env = ensure_env(EnvRequest(cell.requirements, cell.resolve_at), timeout=max(cell.timeout, 900.0))
    except EnvBuildError as exc:
        return {**result, "outcome": Outcome.CANNOT_RUN.value, "why": f"environment: {exc}"}
    result.update(env_seconds=round(env.seconds, 2), env_built=env.built, packages=env.packages,
                  env_path=env.path)
    with tempfile.TemporaryDirectory(prefix="reprokit-cell-") as tmp:
        top = _extract(archive, archive_name, tmp)
        argv = [env.python, "repro.py"]
        with open(os.path.join(top, "repro.py")) as handle:
            if "--reference" in handle.read():  # archives packed before reprokit had it: run as is
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
    outcome = EXIT_OUTCOMES.get(done.returncode)
    if outcome is None and done.returncode < 0:  # the engine took the process down: its own failure
        outcome, why = Outcome.DIFFERENTLY, f"repro.py was killed by signal {-done.returncode} (the engine crashed)"
    elif outcome is None:
        outcome, why = Outcome.CANNOT_RUN, f"repro.py exited {done.returncode}"
    else:
        why = _last_verdict_line(done.stdout)
    return {**result, "outcome": outcome.value, "why": why}


def _last_verdict_line(text: str) -> str:
    words = ("REPRODUCES", "DOES NOT REPRODUCE", "DIVERGES DIFFERENTLY", "DIFFERENT FAILURE", "COULD NOT RUN")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(words)]
    return lines[-1] if lines else ""


def _extract(archive: bytes, name: str, into: str) -> str:
    """The archive's top folder. The driver already checked the archive (safe_extract and its
    manifest); here members that leave the folder or are links are refused all the same."""
    if name.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(archive)) as handle:
            for member in handle.namelist():
                _inside(into, member)
            handle.extractall(into)
    else:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as handle:
            members = handle.getmembers()
            for member in members:
                _inside(into, member.name)
                if not (member.isfile() or member.isdir()):
                    raise ValueError(f"archive member {member.name} is not a plain file")
            handle.extractall(into, members=members)
    tops = [d for d in os.listdir(into) if os.path.isfile(os.path.join(into, d, "repro.py"))]
    if not tops:
        raise ValueError("the archive has no repro.py")
    return os.path.join(into, tops[0])


def _inside(root: str, member: str) -> None:
    path = os.path.realpath(os.path.join(root, member))
    if os.path.commonpath([os.path.realpath(root), path]) != os.path.realpath(root):
        raise ValueError(f"archive member {member} leaves the archive's folder")
