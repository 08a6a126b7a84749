"""An interrupted command ends, whatever thread its interpreter's shutdown waits on.

A burst of Ctrl-Cs can cut a thread pool's shutdown half-way: ``verify --versions`` under load
was seen alive 48 minutes after its tenth SIGINT, the main thread joining an idle pool worker
at exit. The exit path for an interrupt (cli/app.fail) must end the process with 130 anyway.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

# a non-daemon thread that never ends: what the interpreter's shutdown then joins for ever
SCRIPT = textwrap.dedent(
    """
    import threading
    from reprokit.cli import app
    from reprokit.errors import ExitCode

    app._EXIT_GRACE_S = 1.0
    threading.Thread(target=threading.Event().wait, name="stuck-pool-worker").start()
    app.fail("interrupted", "nothing was lost", ExitCode.INTERRUPTED)
    """
)


def test_an_interrupted_exit_ends_with_130_even_when_a_thread_never_stops(tmp_path):
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
    except subprocess.TimeoutExpired:
        raise AssertionError("the interrupted process did not end: its exit waited on a stuck thread") from None
    assert done.returncode == 130, done.stderr
    assert done.stderr.count("Error: interrupted") == 1 and "Hint: nothing was lost" in done.stderr
