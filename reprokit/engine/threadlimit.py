"""Limits on the number of threads and processes: which ones this process runs under, how close
each is, and whether an engine's "Resource temporarily unavailable" met one. Reads /proc and the
cgroup files only, runs no engine, judges no verdict; standard library only (``verify
--versions``'s cells use it on Ray workers, as ``engine/memorybound.py``).

Why: EAGAIN from ``pthread_create`` (or ``fork``) has two causes that read the same in an
engine's words: the memory bound (the new thread's stack refused by RLIMIT_DATA) and a limit on
the number of tasks — a cgroup's ``pids.max`` (a container's, systemd's TasksMax), the user's
process limit (RLIMIT_NPROC, ``ulimit -u``: every thread of the real user counts; not enforced
for root) or the kernel's ``threads-max``. The second is no memory problem and no verdict:
raising ``--memory-bound`` changes nothing. It is told apart by asking the kernel how close
each limit is when the failure is seen (measured in a cgroup with ``pids.max`` 7: onnxruntime
said "pthread_create failed, error code: 11 error msg: Resource temporarily unavailable", which
was reported as running out of a 2 GiB memory bound, exit 11).
"""

from __future__ import annotations

import os
import re

# What an engine or Python says when a thread or process could not start: onnxruntime's
# pthread_create, Python's threading and fork (BlockingIOError: [Errno 11]), glibc's EAGAIN text.
_REFUSED = re.compile(
    r"Resource temporarily unavailable|can't start new thread|pthread_create failed|"
    r"error code: 11\b|Errno 11\]",
    re.IGNORECASE,
)
HINT = (
    "a limit on the number of threads and processes stopped it, not memory (--memory-bound changes "
    "nothing): raise that limit where reprokit is started (a container's pids limit, ulimit -u) or "
    "run fewer processes at once; an engine starts about two threads per core"
)


def headroom() -> int:
    """The tasks an engine process may start on top of those seen running when reprokit looks:
    a pool per core (onnxruntime's, OpenBLAS's, OpenVINO's streams) and a few of its own. The
    threads an engine started before it failed are mostly gone by then."""
    return 4 * (os.cpu_count() or 1) + 8


def said_refused(*texts: str) -> bool:
    """Do these words say a thread or process could not start (EAGAIN)?"""
    return bool(_REFUSED.search("\n".join(t or "" for t in texts)))


def refused_by_limit(*texts: str) -> str | None:
    """The limit that refused a thread, in words, when ``texts`` say one was refused and a thread
    or process limit of this process is within ``headroom()`` of its use; None otherwise (the
    memory bound, or nothing reprokit can name)."""
    return near_limit() if said_refused(*texts) else None


def refused_words(limit: str, words: str) -> str:
    """'could not start a thread: LIMIT (the engine's sentence); no verdict'."""
    found = _REFUSED.search(words or "")
    said = (
        " ".join(words[found.start() : found.start() + 160].splitlines()[0].split())
        if found
        else ""
    )
    return f"could not start a thread: {limit}" + (f" ({said})" if said else "") + "; no verdict"


def near_limit() -> str | None:
    """The first thread or process limit of this process within ``headroom()`` of its use."""
    room = headroom()
    for where, limit, used in _pids_limits():
        if used + room >= limit:
            return (
                f"the pids.max of {limit} of its cgroup {where} is reached ({used} tasks running)"
            )
    nproc = _user_tasks()
    if nproc is not None and nproc[1] + room >= nproc[0]:
        return (
            f"the process limit of user {os.getuid()}, ulimit -u {nproc[0]}, is reached "
            f"({nproc[1]} threads of that user running)"
        )
    kernel = _kernel_tasks()
    if kernel is not None and kernel[1] + room >= kernel[0]:
        return f"the kernel's threads-max of {kernel[0]} is reached ({kernel[1]} tasks running)"
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _pids_limits() -> list[tuple[str, int, int]]:
    """(cgroup, pids.max, pids.current) of every pids cgroup above this process that has a limit
    (a parent's limit holds for its children too); cgroup v1 and v2."""
    found = []
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:  # not Linux
        return found
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "pids" in controllers.split(","):
            roots = ["/sys/fs/cgroup/pids"]
        elif controllers == "":  # v2: one hierarchy, mounted at the top or beside v1 as unified
            roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        else:
            continue
        for root in roots:
            parts = [p for p in path.split("/") if p]
            while True:
                folder = os.path.join(root, *parts)
                limit = _read_int(os.path.join(folder, "pids.max"))
                used = _read_int(os.path.join(folder, "pids.current"))
                if limit is not None and used is not None:
                    found.append(("/" + "/".join(parts), limit, used))
                if not parts:
                    break
                parts.pop()
    return found


def _user_tasks() -> tuple[int, int] | None:
    """(RLIMIT_NPROC, threads of this real user running), when the limit is enforced here."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft == resource.RLIM_INFINITY or _global_root():
        return None
    uid, count = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as handle:
                fields = dict(
                    line.split(":", 1) for line in handle.read().splitlines() if ":" in line
                )
        except OSError:  # ended meanwhile
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return soft, count


def _global_root() -> bool:
    """Root of the first user namespace, whom the kernel never holds to RLIMIT_NPROC."""
    if os.getuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as handle:
            first = handle.read().split()
    except OSError:
        return True
    return first[:2] == ["0", "0"]


def _kernel_tasks() -> tuple[int, int] | None:
    """(threads-max, tasks running on the machine)."""
    limit = _read_int("/proc/sys/kernel/threads-max")
    try:
        with open("/proc/loadavg") as handle:
            running = int(handle.read().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return None
    return (limit, running) if limit is not None else None
