"""ddmin: delete chunks of nodes anywhere, middle and side branches included.

Complement-only delta debugging over the current best in topological order: try deleting chunks
of half the nodes, then quarters, … down to single nodes; a deletion that keeps the signature is
accepted at once and the sweep continues at the same chunk size. Any subset is a valid model,
because tensors whose producer was deleted are fed with captured reference activations. A
final sweep of single-node deletions with no success proves the result 1-minimal.
"""

from __future__ import annotations


def run(reducer) -> None:
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
