"""The run's record: the journal of candidate outcomes (append-only JSON lines, replayed on
--resume; one key per candidate, ``Reducer.key``) and per-step statistics. Knows nothing of
engines or passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field

from reprokit.files import parse_json


@dataclass
class PassStats:
    calls: int = 0  # engine calls
    candidates: int = 0  # candidates those calls judged (more than calls when packed)
    cached: int = 0
    removed: int = 0
    seconds: float = 0.0
    accepted: int = 0
    invalid: int = 0  # candidates refused before any engine call
    nodes_built: int = 0  # nodes in the models those calls built ("build work")
    heavy_built: int = 0  # their heavy layers (buildcost.heavy_layers): what a TensorRT build pays for
    # the calls whose model held no heavy layer, and their nodes: buildcost.ESTIMATE prices them
    # at the light rate (bench/count_check.py counts a check's calls by the same rule)
    light_calls: int = 0
    light_nodes: int = 0
    # nodes built per member kind of the packed calls (issue 39: where build work goes): the
    # step's own candidates, the original's copy, the marked copy, riders, speculative members
    built_by: dict = field(default_factory=dict)

    def note_built(self, nodes: int, heavy: int, calls: int = 1) -> None:
        """``calls`` builds of one model of ``nodes`` nodes holding ``heavy`` heavy layers (the
        calls themselves are counted by whoever made them)."""
        self.nodes_built += calls * nodes
        self.heavy_built += calls * heavy
        if not heavy:
            self.light_calls += calls
            self.light_nodes += calls * nodes

    def add_built(self, other: PassStats) -> None:
        """The build work ``other`` counted (not its calls), added to this step's."""
        self.nodes_built += other.nodes_built
        self.heavy_built += other.heavy_built
        self.light_calls += other.light_calls
        self.light_nodes += other.light_nodes

    def to_json(self, name: str) -> dict:
        return {"step": name, "calls": self.calls, "candidates": self.candidates, "cached": self.cached,
                "invalid": self.invalid, "nodes_removed": self.removed, "accepted": self.accepted,
                "nodes_built": self.nodes_built, "heavy_built": self.heavy_built,
                "light_calls": self.light_calls, "light_nodes": self.light_nodes, "seconds": round(self.seconds, 3),
                "engine_seconds": round(self.seconds, 3)}  # "seconds": the step's wall time, clock.py


def entry_key(kind: str, text: str) -> str:
    """The one key of a journal entry: its kind ("cand", "precision") and a digest of what it
    judged (a candidate's node set, an fp32 set with its spec)."""
    return f"{kind}:" + hashlib.sha256(text.encode()).hexdigest()[:32]


class Journal:
    """Append-only record of candidate outcomes, replayed on --resume."""

    def __init__(self, path: str | None):
        self.path = path
        self.entries: dict[str, dict] = {}
        self._lock = threading.Lock()
        if path and os.path.exists(path):
            with open(path) as handle:
                for line in handle:
                    line = line.strip()
                    if line:
                        try:
                            entry = parse_json(line, what="a journal line")
                            self.entries[entry["key"]] = entry
                        except (ValueError, KeyError, TypeError):
                            continue  # a line cut by a crash (or edited): that candidate is simply rerun

    def get(self, key: str) -> dict | None:
        with self._lock:
            return self.entries.get(key)

    def claimed(self) -> int:
        """Target calls the passes' allowances added to an auto budget (``Reducer.claim``)."""
        with self._lock:
            return sum(int(e.get("calls", 0)) for k, e in self.entries.items() if k.startswith("allowance:"))

    def put(self, key: str, value: dict) -> None:
        self.put_all([(key, value)])

    def put_all(self, items: list[tuple[str, dict]]) -> None:
        """The outcomes one call produced, in one write: an interrupt between them cannot leave a
        call half journaled (its resumed run would ask the call again for the rest)."""
        with self._lock:
            lines = []
            for key, value in items:
                self.entries[key] = {"key": key, **value}
                lines.append(json.dumps(self.entries[key]) + "\n")
            if self.path and lines:
                with open(self.path, "a") as handle:
                    handle.write("".join(lines))
                    handle.flush()


