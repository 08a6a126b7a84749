"""What reprokit may write, and how: the one rule "never write over a file reprokit did not
create". A base module (like ``errors``): it owns the checks every command makes before any
engine runs, the folder ledger that says which names reprokit owns in an output folder, and
atomic writes. It must not know which files a command writes (``cli.py`` says) nor run engines.

- A path the run reads (the model, its external data, ``--inputs``, a ``--torch`` script) is
  never an output: ``-o`` naming one, or a folder where the run would write over one, is refused.
- An existing output file is replaced only with ``--force``.
- In an output folder reprokit writes only names it claimed; the claim is recorded in
  ``FOLDER/.reprokit/owned.json``. A user's file that a claimed name would replace is refused
  (``--force`` replaces it); the user's other files are left alone.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import os

from reprokit.errors import UsageError

LEDGER = os.path.join(".reprokit", "owned.json")


def atomic_write(path: str, write, *, suffix: str = "") -> str:
    """``write(tmp)`` into a temporary name in ``path``'s own folder, then rename over ``path``:
    a full disk or an interrupt leaves the old file (or none), never half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.writing{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def atomic_text(path: str, text: str) -> str:
    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write(text)

    return atomic_write(path, write)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def read_paths(paths) -> list[str]:
    """Every existing file among ``paths``; a folder stands for every file under it."""
    found = []
    for path in paths:
        if not path or not os.path.exists(path):
            continue
        if os.path.isdir(path):
            for base, _, files in os.walk(path):
                found.extend(os.path.join(base, f) for f in files)
        else:
            found.append(path)
    return found


def claim_file(path: str, reads, *, force: bool, option: str = "-o") -> None:
    """``path`` will be written: refuse when the run reads it, or when it exists and ``force``
    is not given. ``reads``: the files the run reads (:func:`read_paths`)."""
    for source in reads:
        if os.path.exists(path) and _same(path, source):
            raise UsageError(f"{option} {path} is a file this command reads ({source}); writing it would destroy it",
                             hint=f"give {option} another path, e.g. {option} report.tar.gz")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{option} {path} exists; reprokit does not replace a file unless asked",
                         hint="choose another path, or add --force to replace it")


def _owned_patterns(folder: str) -> list[str]:
    try:
        with open(os.path.join(folder, LEDGER)) as handle:
            return [str(p) for p in json.load(handle)["patterns"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def claim_folder(folder: str, patterns, reads, *, force: bool, option: str = "-o") -> None:
    """The run will write files named by ``patterns`` (relative, glob syntax) in ``folder``:
    refuse when one of them is a file the run reads (always) or a file reprokit did not write
    (unless ``force``); then create the folder and record the claim in its ledger."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{option} {folder} exists and is not a directory", hint="choose a directory path")
    patterns = list(patterns)
    if os.path.isdir(folder):
        owned = _owned_patterns(folder)
        if not owned and os.path.exists(os.path.join(folder, ".reprokit", "run.json")):
            owned = patterns  # a shrink folder from before the ledger existed: its names are reprokit's
        for pattern in patterns:
            for existing in sorted(glob.glob(os.path.join(glob.escape(folder), pattern))):
                if not os.path.isfile(existing):
                    continue
                source = next((s for s in reads if _same(existing, s)), None)
                if source is not None:
                    raise UsageError(
                        f"{option} {folder}: the run would write {existing}, a file it reads ({source})",
                        hint=f"write the results elsewhere: {option} {os.path.join(folder, 'reprokit-out')}")
                rel = os.path.relpath(existing, folder)
                if not force and not any(fnmatch.fnmatch(rel, p) for p in owned):
                    raise UsageError(
                        f"{option} {folder}: {existing} exists and was not written by reprokit",
                        hint=f"move it away, give another {option} directory, or add --force to replace it")
    try:
        os.makedirs(os.path.join(folder, os.path.dirname(LEDGER)), exist_ok=True)
        ledger = os.path.join(folder, LEDGER)
        merged = sorted(set(_owned_patterns(folder)) | set(patterns))
        atomic_text(ledger, json.dumps({"schema": "reprokit.owned/1", "patterns": merged}, indent=2))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise  # a full disk: the CLI says so, with its own exit code
        raise UsageError(f"cannot create {option} directory {folder}: {exc.strerror}",
                         hint="choose a writable directory") from exc
