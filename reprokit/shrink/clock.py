"""Wall time per named step of a shrink run, for summary.json: the steps tile the run from the
moment the process started (interpreter start-up and model loading included) to the last write,
so their seconds add up to ``wall_s`` and to what ``time reprokit shrink …`` says. Owns no
engine and no output file; ``output.py`` merges these seconds into the steps it writes.
"""

from __future__ import annotations

import os
import time

from reprokit.shrink.reducer import PassStats


def process_started() -> float:
    """When this process started, on ``time.monotonic()``'s clock: Linux's /proc/self/stat start
    time (clock ticks after boot) set against CLOCK_BOOTTIME; elsewhere, now (no start-up time)."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
    now = time.monotonic()
    return now - age if 0 <= age < now else now


class StepClock:
    """One current step at a time; ``begin`` closes it. Steps are kept in the order begun."""

    def __init__(self, started: float, first: str = "startup"):
        self.started = started
        self.current = first
        self.since = started
        self.closed: dict[str, float] = {}

    def begin(self, name: str) -> None:
        now = time.monotonic()
        self.closed[self.current] = self.closed.get(self.current, 0.0) + (now - self.since)
        self.closed.setdefault(name, 0.0)
        self.current, self.since = name, now

    def seconds(self, now: float) -> dict[str, float]:
        """Every step's wall seconds up to ``now``, the current one included."""
        got = dict(self.closed)
        got[self.current] = got.get(self.current, 0.0) + (now - self.since)
        return got


def timed_steps(rows: dict[str, dict], clock: StepClock | None, now: float) -> list[dict]:
    """summary.json's ``steps``: each step's counts (``PassStats.to_json`` rows, by step name)
    with ``seconds`` its wall time (engine calls, reprokit's own work and writing alike) and
    ``engine_seconds`` the part spent in engine calls. Steps that judged no candidate (start-up,
    capture, pack) get zero counts."""
    if clock is None:
        return list(rows.values())
    wall = clock.seconds(now)
    order = list(wall) + [name for name in rows if name not in wall]
    timed = []
    for name in order:
        row = dict(rows.get(name) or PassStats().to_json(name))
        row["seconds"] = round(wall.get(name, 0.0), 3)
        if name in rows or row["seconds"] > 0:  # a step begun and left at once says nothing
            timed.append(row)
    return timed


def retime(summary: dict, clock: StepClock | None) -> dict:
    """Bring a written summary's ``steps`` and ``wall_s`` up to now (after the archive was packed
    or the audit written, which happen once the reduction has returned)."""
    if clock is None:
        return summary
    now = time.monotonic()
    summary["steps"] = timed_steps({row["step"]: row for row in summary.get("steps", [])}, clock, now)
    summary["wall_s"] = round(now - clock.started, 3)
    return summary
