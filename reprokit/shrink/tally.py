"""Seconds of reprokit's own bookkeeping around engine calls, by kind, for summary.json's
``bookkeeping`` (issue 25: pack building and comparison must stay off the critical path):

- ``extraction``: candidate subgraphs cut out of the model (``graph/extract.py``) and their cut
  tensors checked for the target's storage type (``Reducer.unrepresentable_feed``);
- ``pack``: which members go in which pack (``members.fit``, ``ride_along``) and their copies
  in one packed model (``graph/pack.py``);
- ``write``: models serialized to disk for a worker (the feeds' .npz is the oracle's
  ``CallStats.feeds_seconds``) and the drift window's files (``accumulated._drift_window``);
- ``compare``: a call's outputs judged against their references (verdicts, causal tests, the
  element of largest error).

Owns no engine and no file; the kinds never nest (each is timed at its leaf), so they add up.
One engine call may hide inside ``compare``: the original's replay, when the pack it rode in lost
one of its outputs, runs alone from there (rare).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

KINDS = ("extraction", "pack", "write", "compare")


class Tally:
    """Seconds per kind; safe to add to from --jobs threads."""

    def __init__(self):
        self.seconds = dict.fromkeys(KINDS, 0.0)
        self._lock = threading.Lock()

    @contextmanager
    def timing(self, kind: str):
        start = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - start
            with self._lock:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + spent

    def to_json(self, feeds_seconds: float) -> dict:
        """Each kind's seconds (``write`` with the feeds) and their sum. No share: the run's wall
        time goes on after the summary is first written (the archive), so readers divide by the
        final ``wall_s``."""
        got = dict(self.seconds)
        got["write"] = got.get("write", 0.0) + feeds_seconds
        return {**{k: round(v, 3) for k, v in got.items()}, "seconds": round(sum(got.values()), 3)}
