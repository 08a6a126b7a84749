"""The Reducer: one mutable current best (a set of node indices), a cache of verdicts, a journal
on disk for resume, speculative parallel evaluation, and per-pass statistics.

"Smaller" means fewer nodes; ties are broken by nothing else, so a pass accepts a candidate only
when it has fewer nodes than the best and shows the ORIGINAL signature (no slippage). Passes
propose candidates in a fixed order and take the earliest interesting one, so the result does not
depend on ``jobs``: parallel workers only pre-compute verdicts the sequential order will ask for.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from reprokit.oracle import Signature, Verdict
from reprokit.subgraph import GraphIndex, extract


@dataclass
class PassStats:
    calls: int = 0
    cached: int = 0
    removed: int = 0
    seconds: float = 0.0
    accepted: int = 0
    invalid: int = 0  # candidates refused before any engine call

    def to_json(self, name: str) -> dict:
        return {"step": name, "calls": self.calls, "cached": self.cached, "invalid": self.invalid,
                "nodes_removed": self.removed, "accepted": self.accepted,
                "seconds": round(self.seconds, 3)}


@dataclass
class Outcome:
    """What one candidate did: interesting means "shows the original signature"."""

    interesting: bool
    kind: str
    detail: str
    error: float | None
    from_cache: bool = False


class BudgetExhausted(Exception):
    """The run's target-call budget is spent: stop reducing, keep the best so far."""


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
                            entry = json.loads(line)
                        except json.JSONDecodeError:
                            continue  # a line cut by a crash: that candidate is simply rerun
                        self.entries[entry["key"]] = entry

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, value: dict) -> None:
        with self._lock:
            self.entries[key] = {"key": key, **value}
            if self.path:
                with open(self.path, "a") as handle:
                    handle.write(json.dumps(self.entries[key]) + "\n")
                    handle.flush()


@dataclass
class Reducer:
    model: object
    index: GraphIndex
    store: object  # ActivationStore
    feeds: dict
    oracle: object
    signature: Signature
    workdir: str
    journal: Journal
    jobs: int = 1
    on_accept: Callable[[Reducer, str], None] | None = None
    on_event: Callable[[str], None] | None = None
    best: frozenset = frozenset()
    anchors: list = field(default_factory=list)  # node indices where the signature's kind starts
    origins: list = field(default_factory=list)  # first diverging nodes of any kind
    stats: dict[str, PassStats] = field(default_factory=dict)
    findings: dict[str, int] = field(default_factory=dict)  # other signatures seen, with counts
    one_minimal: bool = False
    budget: int | None = None  # target calls the passes may spend; None = no limit
    spent: int = 0  # distinct candidates the passes asked about that needed an engine call
    cancelled: bool = False  # set on interrupt: outcomes of killed calls are not journaled
    _current: str = "setup"

    def __post_init__(self):
        self._pool = ThreadPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None
        self._lock = threading.Lock()
        self._feed_ok: dict[str, str | None] = {}
        self._asked: set[str] = set()

    # -- candidates -------------------------------------------------------------------------

    @staticmethod
    def key(nodes: Iterable[int]) -> str:
        text = ",".join(map(str, sorted(nodes)))
        return "cand:" + hashlib.sha256(text.encode()).hexdigest()[:32]

    def extraction(self, nodes):
        return extract(self.model, self.index, nodes, self.store, feeds=self.feeds)

    def _evaluate(self, nodes: frozenset) -> Outcome:
        key = self.key(nodes)
        saved = self.journal.get(key)
        if saved is not None:
            return Outcome(saved["interesting"], saved["kind"], saved["detail"], saved["error"], True)
        if not nodes:
            return Outcome(False, "empty", "", None, True)
        sub = self.extraction(nodes)
        if not sub.outputs:
            return Outcome(False, "no-outputs", "", None, True)
        reason = self._unrepresentable_feed(sub.feeds)
        if reason:
            return Outcome(False, "invalid", reason, None, True)
        import uuid

        import onnx

        # A unique file per evaluation: threads never share one. External weights stay where
        # they are; the engines are told the folder (oracle.weights_dir).
        path = os.path.join(self.workdir, f"candidate-{uuid.uuid4().hex}.onnx")
        try:
            onnx.save(sub.model, path)
            reference = {name: self.store.get(name) for name in sub.outputs if name in self.store}
            verdict: Verdict = self.oracle.judge(path, sub.feeds, reference_outputs=reference)
        finally:
            if os.path.exists(path):
                os.remove(path)
        outcome = Outcome(
            interesting=verdict.diverges and self.signature.same_bug(verdict.signature),
            kind=verdict.kind.value, detail=verdict.signature.detail,
            error=max((o.error for o in verdict.outputs), default=None),
            from_cache=verdict.cached,
        )
        if self.cancelled:  # the call was killed by the interrupt: its outcome means nothing
            return outcome
        self.journal.put(key, {"interesting": outcome.interesting, "kind": outcome.kind,
                               "detail": outcome.detail, "error": _jsonable(outcome.error),
                               "nodes": len(nodes)})
        return outcome

    def _unrepresentable_feed(self, feeds: dict) -> str | None:
        """A cut tensor the target's storage type cannot hold (fp16 overflow, mass underflow)
        would carry the fault in the data, not in the kept nodes: such candidates are invalid."""
        from reprokit.compare import unrepresentable

        for name in feeds:
            if name in self.index.graph_inputs:
                continue  # the user's own data stays as it is
            if name not in self._feed_ok:
                self._feed_ok[name] = unrepresentable(self.store.get(name), self.oracle.precision)
            if self._feed_ok[name]:
                return f"cut tensor {name!r}: {self._feed_ok[name]}"
        return None

    def test(self, nodes) -> bool:
        """Is this node set interesting? Counts the call (or the cache hit) for the current pass."""
        nodes = frozenset(nodes)
        key = self.key(nodes)
        fresh = key not in self._asked
        if fresh and self._over_budget() and self._needs_call(nodes):
            raise BudgetExhausted
        start = time.monotonic()
        outcome = self._evaluate(nodes)
        if fresh:
            self._asked.add(key)
            if outcome.kind not in ("empty", "no-outputs", "invalid"):
                self.spent += 1
        stats = self.stats.setdefault(self._current, PassStats())
        with self._lock:
            if outcome.kind in ("empty", "no-outputs"):
                pass  # trivially uninteresting: no engine call, nothing to count
            elif outcome.kind == "invalid":
                stats.invalid += 1
            elif outcome.from_cache:
                stats.cached += 1
            else:
                stats.calls += 1
            stats.seconds += time.monotonic() - start
            if outcome.kind not in ("agree", "empty", "no-outputs", "invalid") and not outcome.interesting:
                label = f"{outcome.kind}: {outcome.detail}" if outcome.detail else outcome.kind
                self.findings[label] = self.findings.get(label, 0) + 1
        return outcome.interesting

    def _over_budget(self) -> bool:
        return self.budget is not None and self.spent >= self.budget

    def _needs_call(self, nodes: frozenset) -> bool:
        """Would asking about ``nodes`` count against the budget (not journaled, not trivial)?"""
        return bool(nodes) and self.journal.get(self.key(nodes)) is None

    def prefetch(self, candidates: list) -> None:
        """Evaluate upcoming candidates in parallel so the sequential order finds them cached.
        With jobs == 1 this does nothing: results never depend on the number of jobs (the
        budget counts what the sequential order asks for, not what was speculated)."""
        if self._pool is None:
            return
        todo = list(dict.fromkeys(frozenset(c) for c in candidates
                                  if c and self.journal.get(self.key(c)) is None))
        if self._over_budget():
            todo = []
        for future in [self._pool.submit(self._evaluate, c) for c in todo[: self.jobs]]:
            future.result()

    def first_interesting(self, candidates: list) -> int | None:
        """Index of the earliest interesting candidate in order, or None."""
        for start in range(len(candidates)):
            self.prefetch(candidates[start : start + self.jobs])
            if self.test(candidates[start]):
                return start
        return None

    # -- progress ---------------------------------------------------------------------------

    def begin(self, name: str) -> None:
        self._current = name
        self.stats.setdefault(name, PassStats())
        self.event(f"{name}: {len(self.best)} nodes")

    def accept(self, nodes, why: str = "") -> None:
        nodes = frozenset(nodes)
        stats = self.stats.setdefault(self._current, PassStats())
        stats.removed += len(self.best) - len(nodes)
        stats.accepted += 1
        self.best = nodes
        self.event(f"{self._current}: kept {len(nodes)} nodes{(' — ' + why) if why else ''}")
        if self.on_accept:
            self.on_accept(self, self._current)

    def event(self, text: str) -> None:
        if self.on_event:
            self.on_event(text)

    def ordered(self, nodes=None) -> list[int]:
        return sorted(self.best if nodes is None else nodes)

    def close(self, *, interrupted: bool = False) -> None:
        """Stop the pool. On an interrupt, kill the engine calls in flight first, so Ctrl-C
        does not wait for a long build, and keep their outcomes out of the journal."""
        if interrupted:
            from reprokit.worker import kill_running

            self.cancelled = True
            kill_running()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=interrupted)


def _jsonable(value):
    if value is None:
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else str(value)
