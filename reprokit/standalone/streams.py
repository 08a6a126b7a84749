"""Output streams that outlive a reader who closed them: ``reprokit check ... | head -1``, ``python
repro.py | head -3``. The first write or flush that meets the closed pipe points the file
descriptor at the null device, and the program goes on to its own end and exit code.

Embedded verbatim in repro.py, so it imports nothing of reprokit; it must not print or decide
anything. Why: an uncaught BrokenPipeError is exit 1, which is DIVERGES for reprokit (click's
handler) and REPRODUCES for repro.py (Python's own code for a traceback) — a lie about a model
that agrees — and a command cut short at its next line, its files unwritten.
"""

from __future__ import annotations

import os
import sys


class ClosedPipeProof:
    """A process stream (stdout, stderr) whose closed pipe sends the rest to the null device."""

    def __init__(self, stream):
        self._wrapped = stream

    def write(self, text: str) -> int:
        try:
            return self._wrapped.write(text)
        except BrokenPipeError:
            self._to_null()
            return len(text)

    def flush(self) -> None:
        try:
            self._wrapped.flush()
        except BrokenPipeError:
            self._to_null()
            self._wrapped.flush()  # what the buffer held goes to the null device

    def _to_null(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._wrapped.fileno())
        finally:
            os.close(null)

    def __getattr__(self, name: str):
        return getattr(self._wrapped, name)


def outlive_closed_pipes() -> None:
    """Wrap this process's stdout and stderr (once; a program's entry point calls it, never a
    library: tests and callers keep their own streams). A stream Python could not open, its
    descriptor closed at the start (``reprokit check ... >&-``), gets the null device on that
    descriptor: writing to None was an AttributeError, and the first file the run opened would
    have taken descriptor 1 — an engine's own output written into it."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is None:
            stream = _null_stream(fd)
            setattr(sys, name, stream)
        if not isinstance(stream, ClosedPipeProof):
            setattr(sys, name, ClosedPipeProof(stream))


def _null_stream(fd: int):
    try:
        os.fstat(fd)
    except OSError:  # closed: the null device takes its place
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        return open(fd, "w", closefd=False)  # noqa: SIM115  (the process's stream, for its whole life)
    return open(os.devnull, "w")  # noqa: SIM115  (open, but Python gave it no stream)
