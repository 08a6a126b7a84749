"""Isolated, cached environments built with uv, one per requirement set.

A cell's environment holds the archive's repro.py requirements and nothing from reprokit's own
environment: ``uv venv`` with the chosen interpreter, then ``uv pip install`` of the exact
requirements (the engine package pinned to the cell's version; the companions resolved as of
that release's upload date, so an old engine gets the numpy it was built against). Cached under
``~/.cache/reprokit/envs/<key>`` (``REPROKIT_ENV_CACHE`` moves it), the key a hash of the
requirement set, the date and the interpreter; built under a file lock and marked complete last,
so parallel cells never use half an environment or build one twice.

An environment is a place code runs: uv installs COPIES (``--link-mode copy``; its default hard
links would make a change in the environment a change in uv's own cache, and so in every later
environment), and before each reuse ``intact`` holds the installed files against their RECORD
hashes (and the RECORD files against the digest taken at build time), and refuses files no
package installed (a ``.pth`` or ``sitecustomize`` runs at start-up): a changed environment is
rebuilt, never used. Cells run with their own pycache folder, so no ``.pyc`` in the
environment is read.

Standard library only (and ``reprokit.files``, which is): Ray workers import this with nothing but
reprokit's own files.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from reprokit.files import read_json

MARKER = "reprokit-env.json"  # written last: an environment without it is incomplete


class EnvBuildError(Exception):
    """uv could not build the environment: the cell cannot run (never a verdict)."""


# The processes cells have running (uv, repro.py, reprokit), so that a Ctrl-C of the driver ends
# them at once instead of letting each thread's process, and the queued cells after it, run on.
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def run_process(argv: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=...)`` that ``stop_all``
    can kill. Raises subprocess.TimeoutExpired (the process killed) as subprocess.run does."""
    with _LIVE_LOCK:
        if _STOPPING.is_set():  # the driver was interrupted: start nothing new
            raise EnvBuildError("interrupted")
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        _LIVE.add(process)
    try:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(process)
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def stop_all() -> None:
    """Kill every process ``run_process`` started and refuse new ones, until ``allow_all``."""
    with _LIVE_LOCK:
        _STOPPING.set()
        for process in _LIVE:
            process.kill()


def allow_all() -> None:
    _STOPPING.clear()


@dataclass(frozen=True)
class EnvRequest:
    requirements: tuple[str, ...]  # e.g. ("onnxruntime==1.28.0", "numpy", "onnx", "ml-dtypes")
    resolve_at: str | None = None  # uv --exclude-newer for the companions: an ISO date
    python: str = sys.executable

    def key(self) -> str:
        text = json.dumps({"requirements": sorted(self.requirements), "resolve_at": self.resolve_at,
                           "python": _python_version(self.python)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class Env:
    path: str
    python: str
    packages: dict[str, str] = field(default_factory=dict)  # what uv installed: name -> version
    built: bool = False  # False: taken from the cache
    seconds: float = 0.0
    rebuilt_why: str | None = None  # the cached one failed ``intact``: what was changed


def cache_root() -> str:
    return os.environ.get("REPROKIT_ENV_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "reprokit", "envs")


def find_uv() -> str | None:
    """The uv binary: on PATH, beside this interpreter, or the one the ``uv`` wheel ships."""
    beside = os.path.join(os.path.dirname(sys.executable), "uv")
    if os.path.exists(beside):
        return beside
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # the uv wheel's own locator
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def ensure_env(request: EnvRequest, *, timeout: float = 900.0) -> Env:
    """The cached environment for ``request``, built first if needed. Raises EnvBuildError."""
    uv = find_uv()
    if uv is None:
        raise EnvBuildError("uv is not installed here: pip install 'reprokit[matrix]'")
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, request.key())
    started = time.perf_counter()
    changed = None
    with open(final + ".lock", "a") as lock:  # "a": never truncates a lock another process holds
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per key; the others wait, then reuse
        if os.path.exists(os.path.join(final, MARKER)):
            changed = intact(final)
            if changed is None:
                return _load(final, started)
        # Built in place (console scripts name their interpreter by absolute path, so a renamed
        # environment would break them); the marker, written last, says it is complete.
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of a killed build
        try:
            _uv(uv, ["venv", "--quiet", "--python", request.python, final], timeout)
            python = _python_in(final)
            args = ["pip", "install", "--quiet", "--link-mode", "copy", "--python", python]
            if request.resolve_at:
                args += ["--exclude-newer", request.resolve_at]
            _uv(uv, args + list(request.requirements), timeout)
            packages = _freeze(uv, python, timeout)
            with open(os.path.join(final, MARKER + ".tmp"), "w") as handle:
                json.dump({"requirements": list(request.requirements), "resolve_at": request.resolve_at,
                           "python": _python_version(request.python), "packages": packages,
                           "records": _records_digest(final), "unlisted": _unlisted(final, _listed(final))},
                          handle, indent=2)
            os.replace(os.path.join(final, MARKER + ".tmp"), os.path.join(final, MARKER))
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
    env = _load(final, started)
    env.built, env.rebuilt_why = True, changed
    return env


@contextlib.contextmanager
def env_in_use(request: EnvRequest, *, timeout: float = 900.0) -> Iterator[Env]:
    """``ensure_env``, holding a shared lock on the environment while the caller runs in it:
    builders and ``matrix clean`` take that lock exclusively, so neither rebuilds nor removes an
    environment a cell is using; cells share it."""
    root = cache_root()
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, request.key())
    started = time.perf_counter()
    with open(final + ".lock", "a") as lock:
        while True:
            fcntl.flock(lock, fcntl.LOCK_SH)
            if os.path.exists(os.path.join(final, MARKER)) and intact(final) is None:
                env = _load(final, started)
                break
            fcntl.flock(lock, fcntl.LOCK_UN)  # build (or rebuild) under the exclusive lock, then share it
            built = ensure_env(request, timeout=timeout)
            fcntl.flock(lock, fcntl.LOCK_SH)
            if os.path.exists(os.path.join(final, MARKER)):  # not removed in between
                env = built
                break
            fcntl.flock(lock, fcntl.LOCK_UN)
        yield env


def intact(path: str) -> str | None:
    """None when the environment at ``path`` is as uv installed it; else the first change found:
    a file that differs from its RECORD hash, a RECORD changed since the build, a file in
    site-packages no RECORD lists that was not there at the build (``__pycache__`` aside: cells
    never read those)."""
    try:
        info = read_json(os.path.join(path, MARKER))
        recorded, extras = info["records"], info["unlisted"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MARKER} is unreadable or predates the integrity check"
    if recorded != _records_digest(path):
        return "a RECORD file changed since the build"
    listed: set[str] = set()
    for record in _records(path):
        with open(record, newline="") as handle:
            for row in csv.reader(handle):
                if not row:
                    continue
                file = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(record)), row[0]))
                listed.add(file)
                if len(row) > 1 and row[1].startswith("sha256=") and _sha256(file) != row[1][7:]:
                    return f"{os.path.relpath(file, path)} differs from its RECORD hash"
    now = _unlisted(path, listed)
    for rel in sorted(set(now) | set(extras)):
        if now.get(rel) != extras.get(rel):
            return f"{rel} was {'added' if rel not in extras else 'changed'} after the build (no package lists it)"
    return None


def _unlisted(path: str, listed: set[str]) -> dict[str, str | None]:
    """site-packages files no RECORD lists (uv's own ``_virtualenv.pth``), by hash."""
    found = {}
    for site in _site_packages(path):
        for top, dirs, files in os.walk(site):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                file = os.path.normpath(os.path.join(top, name))
                if file not in listed:
                    found[os.path.relpath(file, path)] = _sha256(file)
    return found


def _records(path: str) -> list[str]:
    return [r for site in _site_packages(path) for r in sorted(glob.glob(os.path.join(site, "*.dist-info", "RECORD")))]


def _listed(path: str) -> set[str]:
    listed = set()
    for record in _records(path):
        with open(record, newline="") as handle:
            site = os.path.dirname(os.path.dirname(record))
            listed |= {os.path.normpath(os.path.join(site, row[0])) for row in csv.reader(handle) if row}
    return listed


def _site_packages(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "lib", "python*", "site-packages"))
                  + glob.glob(os.path.join(path, "Lib", "site-packages")))


def _records_digest(path: str) -> str:
    digest = hashlib.sha256()
    for record in _records(path):
        digest.update(os.path.relpath(record, path).encode() + b"\0")
        with open(record, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


def _sha256(path: str) -> str | None:
    """The RECORD form of a file's SHA-256 (urlsafe base64, no padding); None when it is gone."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _load(path: str, started: float) -> Env:
    info = read_json(os.path.join(path, MARKER))
    return Env(path, _python_in(path), info.get("packages", {}), False, time.perf_counter() - started)


def _python_in(env: str) -> str:
    return os.path.join(env, "Scripts", "python.exe") if os.name == "nt" else os.path.join(env, "bin", "python")


def _python_version(python: str) -> str:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return ".".join(map(str, sys.version_info[:3]))
    return python  # another interpreter: its path stands for it


def _uv(uv: str, args: list[str], timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    try:
        done = run_process([uv, *args], timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise EnvBuildError(f"uv {args[0]} {args[1]} took more than {timeout:.0f} s") from exc
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        raise EnvBuildError("uv " + " ".join(a for a in args[:2]) + " failed: " + " ".join(lines[-4:])[:600])
    return done.stdout


def _freeze(uv: str, python: str, timeout: float) -> dict[str, str]:
    out = _uv(uv, ["pip", "freeze", "--python", python], timeout)
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)
