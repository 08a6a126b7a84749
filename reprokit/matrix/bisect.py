"""Where in a range of releases the outcome changes, with about log2(n) environments.

Releases are ordered oldest first; "reproduces" is the state searched for, every other verdict
is "does not" (diverging differently is still not the reported bug), and a cell that cannot run
(or ends in an error, no verdict) is skipped like ``git bisect skip`` (the nearest untried release is tried instead). A release
whose outcome is already known (the one the archive was packed with reproduced there) costs no
environment. The search assumes one change per side of a known point and says so; it names the
last reproducing and first non-reproducing release (a fix), or the reverse (a regression).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reprokit.matrix.cells import Outcome


@dataclass
class Boundary:
    """Between ``before`` and ``after`` (adjacent among the releases that could run) the outcome
    changes from ``before_outcome`` to ``after_outcome``."""

    before: str
    after: str
    before_outcome: str
    after_outcome: str

    @property
    def kind(self) -> str:
        return "fixed" if self.before_outcome == Outcome.REPRODUCES.value else "broke"

    def words(self) -> str:
        if self.kind == "fixed":
            return f"first fixed release: {self.after} (last reproducing: {self.before})"
        return f"first reproducing release: {self.after} (last good: {self.before})"


@dataclass
class BisectResult:
    versions: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)  # every release judged, by version
    boundaries: list[Boundary] = field(default_factory=list)
    environments: int = 0  # cells actually run (known outcomes cost none)
    note: str = ""

    def to_json(self) -> dict:
        return {"versions": self.versions, "outcomes": self.outcomes, "environments": self.environments,
                "boundaries": [{**b.__dict__, "kind": b.kind} for b in self.boundaries], "note": self.note}


def bisect(versions: list[str], judge: Callable[[list[str]], dict[str, str]],
           known: dict[str, str] | None = None) -> BisectResult:
    """``judge(vs)`` runs the given releases (in parallel where it can) and returns their outcomes."""
    result = BisectResult(list(versions), dict(known or {}))

    def ask(wanted: list[str]) -> None:
        todo = [v for v in wanted if v not in result.outcomes]
        if todo:
            result.outcomes.update(judge(todo))
            result.environments += len(todo)

    def state(version: str) -> bool | None:
        outcome = result.outcomes[version]
        return outcome == Outcome.REPRODUCES.value if Outcome(outcome).judged else None

    ends = [versions[0], versions[-1]]
    anchors = [v for v in versions if v in result.outcomes and state(v) is not None]
    ask(ends)
    for end, step in ((0, 1), (len(versions) - 1, -1)):  # an end that cannot run: move inwards
        index = end
        while state(versions[index]) is None and 0 < index + step < len(versions) - 1:
            index += step
            ask([versions[index]])
    points = sorted({versions.index(v) for v in versions if v in result.outcomes and state(v) is not None})
    if len(points) < 2:
        result.note = "fewer than two releases of the range could run: no boundary to search"
        return result
    for low, high in zip(points, points[1:]):
        if state(versions[low]) != state(versions[high]):
            boundary = _search(versions, low, high, ask, state, result.outcomes)
            if boundary is not None:
                result.boundaries.append(boundary)
    if not result.boundaries:
        same = "reproduces" if state(versions[points[0]]) else "does not reproduce"
        result.note = (f"{same} at every release judged ({', '.join(versions[p] for p in points)}); "
                       "the releases between them were not run")
    elif anchors:
        result.note = "searched on each side of " + ", ".join(anchors) + " (known without a new environment)"
    return result


def _search(versions, low, high, ask, state, outcomes) -> Boundary | None:
    """Binary search between two releases that differ; untried releases whose cell cannot run
    are stepped over."""
    skipped: set[int] = set()
    while True:
        middle = [i for i in range(low + 1, high) if i not in skipped]
        if not middle:
            return Boundary(versions[low], versions[high], outcomes[versions[low]], outcomes[versions[high]])
        centre = (low + high) / 2
        pick = min(middle, key=lambda i: (abs(i - centre), i))
        ask([versions[pick]])
        found = state(versions[pick])
        if found is None:
            skipped.add(pick)
        elif found == state(versions[low]):
            low = pick
        else:
            high = pick
