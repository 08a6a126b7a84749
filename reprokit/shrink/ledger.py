"""The Reducer's call accounting: the engine-call budget (``claim``, ``calls_left``, ``charge``,
``chunks``) and the per-pass statistics of the calls made and the outcomes read (``note_call``,
``count``).

A mixin of :class:`reprokit.shrink.reducer.Reducer`: it reads and writes the Reducer's fields
(``budget``, ``spent``, ``held``, ``allowance``, ``build_cost``, ``stats``, ``findings``,
``journal``) and holds none of its own. Must not judge a candidate or make an engine call: it
only says whether one may be made and counts what was made.
"""

from __future__ import annotations

from reprokit.shrink.evaluator import Outcome
from reprokit.shrink.journal import PassStats

__all__ = ["TRIVIAL", "BudgetExhausted", "CallLedger"]

TRIVIAL = ("empty", "no-outputs", "invalid", "no-anchor")


class BudgetExhausted(Exception):
    """The run's target-call budget is spent: stop reducing, keep the best so far."""


class CallLedger:
    """How many engine calls the passes may still make, and what each pass spent and saw."""

    def claim(self, calls: int) -> None:
        """A pass whose cost bound is known up front (the conflict-set search) widens an auto
        budget by that bound; an explicit --max-calls stays as given. The grant is journaled:
        a resumed run starts with it (``Journal.claimed``) and is not granted it twice."""
        if self.budget is None or self.allowance is None:
            return
        key = f"allowance:{self._current}"
        if self.journal.get(key) is not None:
            return  # granted before the run was interrupted: already in this run's budget
        granted = self.allowance(calls)
        self.budget += granted
        self.journal.put(key, {"calls": granted})

    def calls_left(self) -> int | None:
        """Engine calls the passes may still make (None: no budget)."""
        if self.budget is None:
            return None
        return max(0, self.budget - self.spent - self.held())

    def chunks(self, candidates) -> tuple[int, bool] | None:
        """Packed by build cost: (candidate nodes in the first call of a sequence judged until its
        first hit, whether each next call's doubles: buildcost.BuildCost.chunks), spending at most
        half the calls the budget leaves; None packs by count (as few calls as the limits allow)."""
        if self.build_cost is None:
            return None
        left = self.calls_left()
        return self.build_cost.chunks(
            sum(len(c) for c in candidates), None if left is None else max(1, left // 2)
        )

    def charge(self, calls: int = 1) -> None:
        """Before an engine call: stop at the budget. The call is counted by ``note_call``."""
        if self.budget is not None and self.spent + calls + self.held() > self.budget:
            raise BudgetExhausted

    def note_call(
        self,
        nodes_built: int,
        candidates: int,
        seconds: float,
        built_by: dict | None = None,
        heavy_built: int = 0,
    ) -> None:
        """One engine call made; ``built_by``: its nodes per member kind (a packed call's);
        ``heavy_built``: the heavy layers of the model it built (buildcost.heavy_layers)."""
        with self._lock:
            self.spent += 1
            stats = self.stats.setdefault(self._current, PassStats())
            stats.calls += 1
            stats.candidates += candidates
            stats.note_built(nodes_built, heavy_built)
            stats.seconds += seconds
            for kind, nodes in (built_by or {}).items():
                stats.built_by[kind] = stats.built_by.get(kind, 0) + nodes

    def count(self, outcome: Outcome) -> Outcome:
        """Per-pass statistics of an outcome a pass looked at (and other signatures seen)."""
        stats = self.stats.setdefault(self._current, PassStats())
        with self._lock:
            if outcome.kind == "invalid":
                stats.invalid += 1
            elif outcome.from_cache and outcome.kind not in TRIVIAL:
                stats.cached += 1
            if outcome.kind not in ("agree", *TRIVIAL) and not outcome.interesting:
                label = f"{outcome.kind}: {outcome.detail}" if outcome.detail else outcome.kind
                self.findings[label] = self.findings.get(label, 0) + 1
        return outcome
