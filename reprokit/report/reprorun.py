"""How reprokit runs an archive's repro.py so that its exit status means what repro.py says:
1 only after it ran both engines and saw the divergence. Python itself exits 1 for a file that
does not compile (an edited copy with a SyntaxError) or an exception raised outside repro.py's
``main``; run through :func:`repro_argv` those are 70 (INTERNAL), never "reproduces" (issue 36).
Must not import or execute the archive's code in reprokit's own process.

Pack's own runs of its tools (the bundled repro.py, polygraphy's ``run --onnxrt``) record when
their engines ran: each appends ``start end`` lines (epoch seconds) to the file named by
``ENGINE_TIMES`` in its environment (repro.py around each engine run, polygraphy through
:func:`timed_polygraphy_argv`'s hooks on onnxruntime's session). :func:`engine_seconds_within`
turns them into the engine seconds of a wait: the rest of the wait stays reprokit's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

INTERNAL = 70
ENGINE_TIMES = "REPROKIT_ENGINE_TIMES"  # the file a tool appends its engine runs' "start end" to

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

    def __init__(self, argv: list[str], cwd: str, logdir: str, timeout: float, *, times: str | None = None):
        self.argv, self.timeout, self.deadline = argv, timeout, time.monotonic() + timeout
        self.paths = [os.path.join(logdir, f".started-{os.getpid()}-{id(self)}.{k}") for k in ("out", "err")]
        self.times = times  # where it records its engine runs (ENGINE_TIMES), None: not asked
        env = {**os.environ, ENGINE_TIMES: times} if times else None
        with open(self.paths[0], "wb") as out, open(self.paths[1], "wb") as err:
            self.process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                            env=env)

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


# Runs polygraphy's own command-line entry point in the child interpreter, with onnxruntime's
# session creation and runs timed into ENGINE_TIMES (its arguments and output unchanged).
_TIMED_POLYGRAPHY = """
import os, sys, time
times = os.environ.get("REPROKIT_ENGINE_TIMES")
def timed(method):
    def run(*args, **kwargs):
        start = time.time()
        try:
            return method(*args, **kwargs)
        finally:
            with open(times, "a") as handle:
                handle.write(f"{start:.6f} {time.time():.6f}\\n")
    return run
if times:
    try:
        import onnxruntime
    except ImportError:
        pass
    else:
        onnxruntime.InferenceSession.__init__ = timed(onnxruntime.InferenceSession.__init__)
        onnxruntime.InferenceSession.run = timed(onnxruntime.InferenceSession.run)
from polygraphy.tools import main
sys.argv[0] = "polygraphy"
sys.exit(main())
"""


def timed_polygraphy_argv(args: list[str]) -> list[str] | None:
    """``polygraphy ARGS`` through this interpreter with its onnxruntime runs timed; None when
    polygraphy is not importable here (the caller runs its executable, untimed)."""
    import importlib.util

    if importlib.util.find_spec("polygraphy") is None:
        return None
    return [sys.executable, "-c", _TIMED_POLYGRAPHY, *args]


def read_times(path: str | None) -> list[tuple[float, float]]:
    """The ``start end`` lines a tool recorded (none when it recorded nothing; a torn or foreign
    line is skipped: it can only lower the engine seconds counted)."""
    found = []
    if not path or not os.path.exists(path):
        return found
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            parts = line.split()
            try:
                start, end = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            if end >= start:
                found.append((start, end))
    return found


def engine_seconds_within(runs: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] (epoch) during which at least one engine run was going: runs that
    overlap one another count once, and time outside the wait (reprokit busy with its own work
    while the tools ran) counts not at all."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in runs if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total
