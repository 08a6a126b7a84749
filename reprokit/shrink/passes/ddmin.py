"""ddmin: delete chunks of nodes anywhere, middle and side branches included.

Complement-only delta debugging over the current best in topological order: try deleting chunks
of half the nodes, then quarters, … down to single nodes; a deletion that keeps the signature is
accepted at once. Any subset is a valid model, because tensors whose producer was deleted are fed
with captured reference activations. A final sweep of single-node deletions with no success
proves the result 1-minimal.

With a packed oracle one engine call judges many candidates, so every granularity is asked at
once, coarsest first (the earliest interesting one is the largest deletion): a call per accepted
deletion, and the last sweep — all "minimal minus one node" candidates — is one call, usually
answered from the cache that localization filled.
"""

from __future__ import annotations


def run(reducer) -> None:
    if reducer.packing == "numeric":
        _all_granularities(reducer)
        return
    chunk = max(1, len(reducer.best) // 2)
    while True:
        removed_any = False
        position = 0
        while position < len(reducer.best):
            order = reducer.ordered()
            candidates = [frozenset(order) - frozenset(order[p : p + chunk])
                          for p in range(position, len(order), chunk)]
            hit = reducer.first_interesting(candidates)
            if hit is None:
                break
            reducer.accept(candidates[hit], f"deleted {chunk} node(s)")
            removed_any = True
            position += hit * chunk
        if chunk == 1:
            if not removed_any:
                reducer.one_minimal = True
                return
        else:
            chunk = max(1, chunk // 2)


def deletions(order: list[int]) -> list[frozenset]:
    """Every complement ddmin asks about for this node order, coarsest first: deleting halves,
    quarters, … single nodes."""
    best = frozenset(order)
    candidates: list[frozenset] = []
    chunk = max(1, len(order) // 2)
    while True:
        candidates += [best - frozenset(order[p : p + chunk]) for p in range(0, len(order), chunk)]
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    return list(dict.fromkeys(candidates))


def _all_granularities(reducer) -> None:
    while True:
        order = reducer.ordered()
        best = frozenset(order)
        candidates = deletions(order)
        hit = reducer.first_interesting(candidates)
        if hit is None:
            reducer.one_minimal = True
            return
        reducer.accept(candidates[hit], f"deleted {len(best) - len(candidates[hit])} node(s)")
