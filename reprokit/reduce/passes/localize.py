"""localize: start where the divergence starts.

The layerwise run names anchor nodes: the first tensors that go non-finite (or, for a mismatch,
exceed the tolerance) while their inputs still agree. The smallest region that reproduces is
usually the anchor alone, fed with the captured reference activations: one target call settles
most NaN/overflow cases. If it does not (fusion, accumulated error), grow the region backwards
inside the anchor's ancestor cone by exponential probing — widths 1, 2, 4, 8 … — which costs
log2 of the distance to the true start instead of a walk over the whole graph.
"""

from __future__ import annotations

# Only the first anchor: when its whole ancestor cone does not reproduce, the divergence is not
# local (fusion, accumulated error) and later anchors, deeper still, rarely do better.
MAX_ANCHORS = 1


def run(reducer) -> bool:
    """Accept the smallest reproducing region around an anchor; True when one was found."""
    for anchor in reducer.anchors[:MAX_ANCHORS]:
        if anchor not in reducer.best:
            continue
        cone = sorted(reducer.index.ancestors(anchor, within=set(reducer.best)))
        widths, width = [], 1
        while width < len(cone):
            widths.append(width)
            width *= 2
        widths.append(len(cone))
        candidates = [frozenset(cone[-w:]) for w in widths]
        candidates = [c for c in candidates if len(c) < len(reducer.best)]
        hit = reducer.first_interesting(candidates)
        if hit is not None:
            reducer.accept(candidates[hit], f"region of {len(candidates[hit])} nodes ending at the anchor")
            return True
    return False
