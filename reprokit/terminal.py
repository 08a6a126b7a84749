"""Where reprokit's text goes: the two rich consoles ``out`` and ``err`` that the CLI prints
through. Names come from models and archives that may be a stranger's: no control character of
theirs reaches the terminal (``_SafeConsole``), a name that reads as rich markup is shown as
written, and piped output keeps no padding (``_TrimmedLines``).

Must not format verdicts or tables (``console.py`` does); only the CLI prints.
"""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.segment import Segment

from reprokit.standalone.streams import outlive_closed_pipes  # the console script's streams

__all__ = ["err", "out", "outlive_closed_pipes"]


class _TrimmedLines:
    """A text stream for piped output that drops the spaces rich pads every table row with to the
    console's width (200 columns when piped), so `reprokit backends | less` shows no ragged
    right edge. The stream is looked up on every write: tests and callers swap sys.stdout."""

    def __init__(self, name: str):
        self._name = name
        self._spaces = ""  # trailing spaces held back until we know a newline does not follow

    @property
    def _stream(self):
        return getattr(sys, self._name)

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        trimmed = re.sub(r" +\n", "\n", self._spaces + text)
        body = trimmed.rstrip(" ")
        self._spaces = trimmed[len(body) :]
        self._stream.write(body)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _SafeConsole(Console):
    """A Console whose text never carries a control character to the terminal: a tensor name
    such as ``"\x1b[2J\x1b]0;title\x07y"`` in an archive's model cleared the screen and could
    rewrite what verify printed. Rich's own styling is added after this, so colours stay."""

    def _render_buffer(self, buffer) -> str:
        return super()._render_buffer(
            segment
            if segment.control
            else Segment(
                _CONTROL.sub(lambda m: repr(m.group())[1:-1], segment.text),
                segment.style,
                segment.control,
            )
            for segment in buffer
        )

    def print(self, *objects, **kwargs) -> None:
        """A name some line prints unescaped (``"y[/bold]"``) is shown as written, never a crash."""
        from rich.errors import MarkupError

        try:
            super().print(*objects, **kwargs)
        except MarkupError:
            super().print(*objects, **{**kwargs, "markup": False})


def _console(stderr: bool) -> Console:
    console = _SafeConsole(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped output (logs, CI): wide enough that tensor names are never cut, no padding kept.
        console = _SafeConsole(
            file=_TrimmedLines("stderr" if stderr else "stdout"),
            highlight=False,
            soft_wrap=True,
            width=200,
        )
    return console


out = _console(False)
err = _console(True)
