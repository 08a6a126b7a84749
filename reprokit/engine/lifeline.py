"""An engine worker ends with the reprokit process that started it. Workers run in a session of
their own (a timeout or an interrupt kills their whole group), so a reprokit killed outright
(SIGKILL, the OOM killer, a CI job's timeout) left them running: an engine looping on a model
that never ends kept a core busy after its parent was gone, with nobody left to enforce the
timeout. Linux's parent-death signal kills the worker when its parent dies; elsewhere nothing
is done. Standard library only; runs no engine, judges nothing.

Not covered: a ``cmd:`` check command, which reprokit starts directly (no worker process) and
whose process is the user's own — it may be killed by reprokit's timer only while reprokit lives.
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def tie_to_parent(parent_pid: int | None) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; end at once where the parent
    (``parent_pid``, who wrote the job) is gone already — it died before the request was made.
    False where the platform has no such request (nothing is done)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # orphaned before the request: no one reads this job's result
    return True
