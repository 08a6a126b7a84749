"""branches: keep one output's ancestor cone.

A window usually still holds side branches that feed other outputs. For each sink of the
current best (a node whose outputs no kept node consumes), the cone of its ancestors is a
candidate; the smallest interesting cone wins. One call per sink at most, and it removes whole
branches at once, which node-chunk deletion would need many calls for.
"""

from __future__ import annotations


def run(reducer) -> None:
    best = set(reducer.best)
    consumed = {t for i in best for t in reducer.index.node_inputs[i]}
    sinks = [i for i in sorted(best) if not any(t in consumed for t in reducer.index.node_outputs[i])]
    if len(sinks) < 2:
        return
    cones = sorted({frozenset(reducer.index.ancestors(s, within=best)) for s in sinks},
                   key=lambda c: (len(c), sorted(c)))
    cones = [c for c in cones if reducer.smaller(c)]
    hit = reducer.first_interesting(cones)
    if hit is not None:
        reducer.accept(cones[hit], "one output's ancestor cone")
