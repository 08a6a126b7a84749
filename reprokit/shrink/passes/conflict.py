"""conflict: the k nodes that fail only together, by a conflict-set search (QuickXplain, Junker 2004).

When no single node (and no producer→consumer pair) shows the bug alone, the nodes interact: a
check that fails only when two distant nodes are both in the model, or an error that needs a
chain to build up. Growing unions spends calls on sets that are almost the whole model; bisecting
a contiguous window (polygraphy) keeps everything between the two ends. QuickXplain splits the
nodes in halves and asks, recursively, "with what is already known to be needed, does this half
fail without the other?": it finds a minimal set of k necessary nodes in at most
2k·⌈log2(n/k)⌉ + 2k candidates judged alone, each through the Reducer's cache (so what the survey
judged costs nothing), and in topological order, so the halves are windows of the graph.

The result is verified alone before it is accepted: a check that is not monotone (a node set that
fails while a superset passes) can make the search end on a set that does not fail; it is then
left to the window and ddmin passes, and counted as a contradiction.
"""

from __future__ import annotations

import math


def run(reducer) -> bool:
    """Accept a minimal set of nodes that shows the signature alone; True when found."""
    order = reducer.ordered()
    if len(order) < 3:
        return False
    # the search's bound for a pair (k = 2): 2k·⌈log2(n/k)⌉ + 2k, the auto budget's bisection aside
    reducer.claim(4 * math.ceil(math.log2(len(order) / 2)) + 4 - 2 * math.ceil(math.log2(len(order) + 1)))
    found = quickxplain(reducer.test, order)
    if found is None or not reducer.smaller(found):
        return False
    if not reducer.test(found):
        reducer.contradictions += 1  # the search's own answers disagree: not monotone, or flaky
        return False
    reducer.accept(found, f"{len(found)} nodes that fail only together (conflict-set search)")
    return True


def quickxplain(test, order: list[int]) -> frozenset | None:
    """A minimal subset of ``order`` for which ``test`` holds, assuming it holds on all of
    ``order`` and is monotone (a superset of a failing set fails). ``test`` takes a frozenset."""
    if not order:
        return None
    return frozenset(_qx(test, frozenset(), False, list(order)))


def _qx(test, background: frozenset, asked: bool, candidates: list[int]) -> list[int]:
    """Junker's QX: the part of ``candidates`` that ``background`` needs to fail. ``asked``:
    ``background`` grew since the last question, so it may fail on its own already."""
    if asked and background and test(background):
        return []
    if len(candidates) == 1:
        return candidates
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    # the later half first: with the earlier half as background, what of the later one is needed
    needed_second = _qx(test, background | frozenset(first), True, second)
    needed_first = _qx(test, background | frozenset(needed_second), bool(needed_second), first)
    return needed_first + needed_second
