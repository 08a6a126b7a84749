"""How reprokit runs an archive's repro.py so that its exit status means what repro.py says:
1 only after it ran both engines and saw the divergence. Python itself exits 1 for a file that
does not compile (an edited copy with a SyntaxError) or an exception raised outside repro.py's
``main``; run through :func:`repro_argv` those are 70 (INTERNAL), never "reproduces" (issue 36).
Must not import or execute the archive's code in reprokit's own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

INTERNAL = 70

# Runs in the child interpreter: compile first (a SyntaxError is 70), then the script as
# __main__; its sys.exit codes pass through, anything else it raises is 70.
_LAUNCH = """
import runpy, sys, traceback
path = sys.argv[1]
try:
    with open(path, encoding="utf-8") as handle:
        compile(handle.read(), path, "exec")
except (OSError, SyntaxError, ValueError) as exc:
    print(f"INTERNAL ERROR: {path} cannot be run: {exc.__class__.__name__}: {exc}")
    sys.exit(70)
sys.argv = sys.argv[1:]
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    print(f"INTERNAL ERROR: {path} raised outside its main(): nothing was judged")
    sys.exit(70)
"""


def repro_argv(script: str = "repro.py", *args: str) -> list[str]:
    """The command that runs ``script`` (relative to the archive folder) with this interpreter."""
    return [sys.executable, "-c", _LAUNCH, script, *args]


class Started:
    """A command started in the background, its output to files in ``logdir`` (never a pipe a
    long log could fill): pack runs repro.py while polygraphy writes its logs, both on CPU
    cores the other leaves idle. :meth:`result` waits at most ``timeout`` seconds from the
    start and returns what ``subprocess.run(..., capture_output=True, text=True)`` would (exit
    124 and "timed out after … s" past it, the child killed)."""

    def __init__(self, argv: list[str], cwd: str, logdir: str, timeout: float):
        self.argv, self.timeout, self.deadline = argv, timeout, time.monotonic() + timeout
        self.paths = [os.path.join(logdir, f".started-{os.getpid()}-{id(self)}.{k}") for k in ("out", "err")]
        with open(self.paths[0], "wb") as out, open(self.paths[1], "wb") as err:
            self.process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill it if it still runs (an interrupt, an error before :meth:`result`): no orphan."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for path in self.paths:
            if os.path.exists(path):
                os.remove(path)

    def result(self) -> subprocess.CompletedProcess:
        try:
            code = self.process.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            timed_out = False
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code, timed_out = 124, True
        texts = []
        for path in self.paths:
            with open(path, "rb") as handle:
                texts.append(handle.read().decode(errors="replace"))
            os.remove(path)
        if timed_out:
            texts[1] = f"timed out after {self.timeout} s"
        return subprocess.CompletedProcess(self.argv, code, texts[0], texts[1])
