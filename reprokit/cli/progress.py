"""Progress for people while a command runs: a line at least every few seconds, so a long
step (a big model's capture, an engine build) is never silent for long. Only the CLI uses it;
library code reports progress through ``on_event`` callbacks.
"""

from __future__ import annotations

import threading
import time

from rich.markup import escape

from reprokit.console import err


class Ticker:
    """Progress lines on stderr (``ticker(text)``). When a step says nothing for ``every``
    seconds, a watcher thread prints that it is still at it, so a long capture, engine call, pack
    or comparison is never silent (issue 28: 100 s and 180 s without a line on a 1,493-node
    model). ``close()`` before the result is printed; every ticker is closed before an error."""

    _open: list[Ticker] = []

    def __init__(self, *, stamp: bool = False, every: float = 5.0, quiet: bool = False):
        self.start = time.monotonic()
        self.stamp, self.every, self.quiet = stamp, every, quiet
        self._lock = threading.Lock()
        self._text, self._said, self._beat = "", self.start, self.start
        self._stop = threading.Event()
        self._thread = None
        if not quiet:
            self._thread = threading.Thread(target=self._watch, name="reprokit-ticker", daemon=True)
            self._thread.start()
            Ticker._open.append(self)

    def __call__(self, text: str) -> None:
        if self.quiet:
            return
        with self._lock:
            now = time.monotonic()
            self._text, self._said, self._beat = text, now, now
            self._print(now, escape(text))

    def _print(self, now: float, text: str) -> None:
        err.print((f"[dim]{now - self.start:7.1f}s[/] {text}") if self.stamp else f"[dim]{text}[/]")

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                now = time.monotonic()
                if self._text and now - self._beat >= self.every:
                    self._beat = now
                    said = self._text if len(self._text) <= 60 else self._text[:59] + "…"
                    self._print(now, f"{escape(said)} [dim]— still at it ({now - self._said:.0f} s)[/]")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self in Ticker._open:
            Ticker._open.remove(self)

    @classmethod
    def close_all(cls) -> None:
        for ticker in list(cls._open):
            ticker.close()
