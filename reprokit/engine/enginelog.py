"""Where the engines' own log lines go: onnxruntime's ``[W:onnxruntime:…]`` warnings, OpenVINO's
and TensorRT's (polygraphy's) loggers, onnx-graphsurgeon's ``[W]`` lines.

They are not reprokit's words and never reach the console on their own: every engine call runs
in a worker process whose output goes to its ``stderr.log`` (:mod:`reprokit.engine.worker`), and the few
engine and tool calls made in this process (onnx-graphsurgeon's constant folding, which runs
onnxruntime) are wrapped in :func:`captured`, which points file descriptors 1 and 2 at a file
while they run. Both hand the text to :func:`record`, which appends it to the run's log file (set
by the CLI: ``OUT/engine.log``) and shows it on stderr only when the CLI asked for it
(``--debug``, ``-v``). Nothing here prints by itself: the CLI installs the echo.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # onnxruntime colours its lines on a terminal
_LOCK = threading.Lock()
_LOG_PATH: str | None = None  # the run's log file; None: engine messages are kept nowhere
_ECHO: Callable[[str, str], None] | None = None  # (label, text) -> shown on the console


def set_log(path: str | None, *, fresh: bool = False) -> None:
    """Append the engines' messages of this run to ``path`` (None: keep them nowhere);
    ``fresh``: a new run, so an older run's log there is removed first. The file is made by the
    first message: a run whose engines said nothing leaves none."""
    global _LOG_PATH
    _LOG_PATH = os.path.abspath(path) if path else None
    if _LOG_PATH and fresh:
        with contextlib.suppress(OSError):
            os.remove(_LOG_PATH)


def log_path() -> str | None:
    return _LOG_PATH


def set_echo(echo: Callable[[str, str], None] | None) -> None:
    """``echo(label, text)`` shows each recorded message (the CLI's ``--debug``/``-v``)."""
    global _ECHO
    _ECHO = echo


def record(label: str, text: str) -> None:
    """One engine call's messages: into the run's log file, and to the echo when one is set."""
    text = _ANSI.sub("", text)
    if not text.strip():
        return
    with _LOCK:
        if _LOG_PATH:
            try:
                with open(_LOG_PATH, "a", encoding="utf-8", errors="replace") as handle:
                    handle.write(f"==> {label}\n{text.rstrip()}\n")
            except OSError:
                pass  # a log that cannot be written never stops a run
        if _ECHO is not None:
            _ECHO(label, text.rstrip())


def record_file(label: str, path: str) -> None:
    """:func:`record` a worker's whole ``stderr.log``."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return
    record(label, text)


@contextlib.contextmanager
def captured(label: str):
    """Run an in-process engine or tool call with file descriptors 1 and 2 pointed at a file
    (onnxruntime and OpenVINO write from C++, graphsurgeon through ``print``), then
    :func:`record` what it wrote. Only the main thread redirects: file descriptors belong to the
    whole process, and another thread's progress lines must not vanish into the log."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with tempfile.TemporaryFile() as sink:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = [os.dup(1), os.dup(2)]
        printed = io.StringIO()  # Python-level writers (print), where sys.stdout is no file descriptor
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            record(label, printed.getvalue() + sink.read().decode("utf-8", "replace"))
