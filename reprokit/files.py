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
- One command at a time writes an output: a claimed folder (``FOLDER/.reprokit/lock``) or file
  (``.NAME.reprokit-lock`` beside it) is locked for the process's life (``hold``); a second
  command is refused at once, naming the holder. The lock is the kernel's (``flock``), so a crashed
  run's lock is free again; its file, left with the dead run's details, is taken over.

It also owns the ONE reader of JSON files reprokit reads back (:func:`read_json`,
:func:`parse_json`): archive members, run state, the ledger, locks, budgets, matrix results. A
file may come from anyone (an archive, an edited output folder), so the reader bounds the bytes
it reads and the nesting it accepts before any caller sees a value, and raises one error type,
``UnreadableJSON`` (a ValueError), that each caller turns into its own documented error.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import os
import socket
import stat
import sys
import time

from reprokit.errors import UsageError

LEDGER = os.path.join(".reprokit", "owned.json")
LOCK = os.path.join(".reprokit", "lock")
_HELD: dict[str, int] = {}  # lock file -> its open descriptor, held until the process ends
_OWNER = os.getpid()  # a forked worker inherits _HELD but never releases its parent's locks


MAX_JSON_BYTES = 64 << 20  # files reprokit wrote itself: a survey's worker result lists 10^5 outputs
MAX_JSON_DEPTH = 64  # reprokit's own files nest fewer than 10 deep; Python's parser recurses per level


class UnreadableJSON(ValueError):
    """A JSON file or text reprokit will not use: missing, not a regular file, larger than its
    bound, not JSON, or nested deeper than ``MAX_JSON_DEPTH``. The message says which."""


def read_json(path: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
              what: str | None = None):
    """The JSON value in ``path``, read through one bounded door: at most ``max_bytes`` are read
    (a larger file is refused unread past them), a FIFO or device is refused before any read
    (never waited on), and the value may nest at most ``max_depth`` deep. Raises UnreadableJSON,
    whose message names the file as ``what`` (default: ``path``)."""
    what = what or path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UnreadableJSON(f"{what}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableJSON(f"{what} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise UnreadableJSON(f"{what}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnreadableJSON(f"{what} is larger than {max_bytes >> 20} MiB, more than reprokit reads of it")
    return parse_json(data, max_depth=max_depth, what=what)


def parse_json(data: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, what: str = "the text"):
    """``json.loads(data)`` that raises UnreadableJSON for anything it cannot use: not JSON (or
    not UTF-8), or nested deeper than ``max_depth`` (past Python's recursion limit ``json`` raises
    RecursionError, which no caller expects). Bound the size of ``data`` before calling."""
    try:
        value = json.loads(data)
    except RecursionError as exc:
        raise UnreadableJSON(f"{what} nests deeper than {max_depth} levels") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise UnreadableJSON(f"{what} is not JSON ({exc})") from exc
    if _depth_exceeds(value, max_depth):
        raise UnreadableJSON(f"{what} nests deeper than {max_depth} levels")
    return value


def _depth_exceeds(value, limit: int) -> bool:
    """Does ``value`` nest lists/dicts more than ``limit`` deep? Walked with a stack, not recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


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
    """``path`` will be written: refuse when another command is writing it (:func:`hold`), when
    the run reads it, or when it exists and ``force`` is not given. ``reads``: the files the run
    reads (:func:`read_paths`)."""
    folder, name = os.path.split(os.path.abspath(path))
    if os.path.isdir(folder):  # a missing folder is said by the write itself, as before
        hold(os.path.join(folder, f".{name}.reprokit-lock"), path, option=option)
    for source in reads:
        if os.path.exists(path) and _same(path, source):
            raise UsageError(f"{option} {path} is a file this command reads ({source}); writing it would destroy it",
                             hint=f"give {option} another path, e.g. {option} report.tar.gz")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{option} {path} exists; reprokit does not replace a file unless asked",
                         hint="choose another path, or add --force to replace it")


def _owned_patterns(folder: str) -> list[str]:
    """The names the folder's ledger says reprokit owns; none when it is missing or unreadable (then
    nothing there is treated as reprokit's: a file is written over only with --force)."""
    try:
        return [str(p) for p in read_json(os.path.join(folder, LEDGER))["patterns"]]
    except (ValueError, KeyError, TypeError):
        return []


def claim_folder(folder: str, patterns, reads, *, force: bool, option: str = "-o") -> None:
    """The run will write files named by ``patterns`` (relative, glob syntax) in ``folder``:
    refuse when one of them is a file the run reads (always) or a file reprokit did not write
    (unless ``force``); then create the folder and record the claim in its ledger."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{option} {folder} exists and is not a directory", hint="choose a directory path")
    patterns = list(patterns)
    state = os.path.join(folder, os.path.dirname(LEDGER))
    if os.path.islink(state):  # its run state, lock and clean-up would land wherever the link points
        raise UsageError(f"{option} {folder}: {state} is a link (to {os.readlink(state)}); reprokit keeps its "
                         "state only inside its output folder",
                         hint=f"remove the link, or give another {option} directory")
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
        hold(os.path.join(folder, LOCK), folder, option=option)
        ledger = os.path.join(folder, LEDGER)
        merged = sorted(set(_owned_patterns(folder)) | set(patterns))
        atomic_text(ledger, json.dumps({"schema": "reprokit.owned/1", "patterns": merged}, indent=2))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise  # a full disk: the CLI says so, with its own exit code
        raise UsageError(f"cannot create {option} directory {folder}: {exc.strerror}",
                         hint="choose a writable directory") from exc


def hold(lock_path: str, output: str, *, option: str = "-o") -> None:
    """Lock ``output`` (through ``lock_path``) for the rest of this process, or refuse at once
    (exit 2) naming the process that holds it: pid, host, start time, command. A lock file left
    by a run that died (its ``flock`` went with it) is taken over; ``stale_lock`` says whose."""
    import fcntl

    lock_path = os.path.abspath(lock_path)
    if lock_path in _HELD:
        return
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # a full disk: the CLI says so, with its own exit code
            raise UsageError(f"cannot write {option} {output}: {lock_path}: {exc.strerror}",
                             hint=f"choose a writable place for {option}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO there was "cannot create -o directory: Invalid argument"
            os.close(fd)
            raise UsageError(f"cannot lock {option} {output}: {lock_path} is not a regular file",
                             hint=f"it is where reprokit keeps its lock: delete it, or write elsewhere (another {option})")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(f"{option} {output} is in use by another reprokit command ({_who(holder)})",
                             hint=f"wait for it to end, or write elsewhere (another {option}); if that process "
                                  f"is gone, delete {lock_path}") from None
        except OSError:  # a file system without flock: the holder's pid is the only evidence
            holder = _holder(fd)
            if holder.get("host") == socket.gethostname() and _alive(holder.get("pid")):
                os.close(fd)
                raise UsageError(f"{option} {output} is in use by another reprokit command ({_who(holder)})",
                                 hint=f"wait for it to end, or write elsewhere (another {option})") from None
        try:  # the holder may have released (deleted) the file between our open and our lock
            current = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    left = _holder(fd)
    if left.get("pid"):
        STALE.append(f"took over {lock_path}, left by a run that ended without releasing it ({_who(left)})")
    if not _HELD:
        import atexit

        atexit.register(release_all)
    _HELD[lock_path] = fd  # held from here: even a write that fails below (a full disk) is cleaned up
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
          "command": " ".join(sys.argv)[:400]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)


STALE: list[str] = []  # what hold() took over, for the command to say


def release_all() -> None:
    """Delete and unlock every lock this process holds (at exit; a crash leaves the file, not the lock)."""
    if os.getpid() != _OWNER:
        return
    for path, fd in list(_HELD.items()):
        try:
            os.remove(path)  # while still locked: a waiting opener sees another inode and retries
        except OSError:
            pass
        os.close(fd)
        del _HELD[path]


def _holder(fd: int) -> dict:
    try:
        found = parse_json(os.pread(fd, 4096, 0) or b"{}", what="the lock file")
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def _who(holder: dict) -> str:
    if not holder.get("pid"):
        return "it has not said who yet"
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder['pid']} on {holder.get('host', '?')}, started {when}: {holder.get('command', '?')}"
