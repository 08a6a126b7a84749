"""localize: start where the divergence starts.

The layerwise run names anchor nodes: the first tensors that show the signature's kind while
their inputs do not. The smallest region that reproduces is usually the anchor alone, fed with
the captured reference activations: one target call settles most NaN/overflow cases. If it does
not, the anchor's whole ancestor cone is tried next: when even that does not reproduce, the
divergence is not local (a fusion that marking breaks, error accumulated over the graph) and
localization gives up after two calls, leaving the search to the window pass. Otherwise the
region grows backwards inside the cone by exponential probing — widths 2, 4, 8 … — which costs
log2 of the distance to the true start instead of a walk over the whole graph.
"""

from __future__ import annotations

# Only the first anchor: when its whole ancestor cone does not reproduce, later anchors, deeper
# still, rarely do better.
MAX_ANCHORS = 1


def run(reducer) -> bool:
    """Accept the smallest reproducing region around an anchor; True when one was found."""
    for anchor in reducer.anchors[:MAX_ANCHORS]:
        if anchor not in reducer.best:
            continue
        cone = sorted(reducer.index.ancestors(anchor, within=set(reducer.best)))

        def region(width: int, cone=cone) -> frozenset:  # the last nodes of the cone, up to the anchor
            return frozenset(cone[-width:])

        smaller = len(cone) < len(reducer.best)
        reducer.prefetch([region(1), region(len(cone))] if smaller else [region(1)])
        if reducer.test(region(1)):
            reducer.accept(region(1), "the anchor alone")
            return True
        if len(cone) == 1 or (smaller and not reducer.test(region(len(cone)))):
            return False
        widths = []
        width = 2
        while width < len(cone):
            widths.append(width)
            width *= 2
        candidates = [region(w) for w in widths]
        hit = reducer.first_interesting(candidates)
        if hit is not None:
            reducer.accept(candidates[hit], f"region of {len(candidates[hit])} nodes ending at the anchor")
            return True
        if smaller:
            reducer.accept(region(len(cone)), "the anchor's ancestor cone")
            return True
    return False
