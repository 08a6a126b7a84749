"""localize: start where the divergence starts.

The layerwise run names anchor nodes: the first tensors that show the signature's kind while
their inputs do not. The smallest region that reproduces is usually the anchor alone, fed with
the captured reference activations: one target call settles most NaN/overflow cases. When the
trouble starts upstream in another form — an origin, e.g. a variance that overflows to inf and
only later becomes the mismatch the signature holds — the path from that origin to the anchor
is tried first, also one call. If neither holds, the anchor's whole ancestor cone is tried: when even that does not reproduce, the
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
        path = origin_path(reducer, anchor, set(cone))
        reducer.prefetch(([path] if path else []) + [region(1), region(len(cone))])
        if path and reducer.test(path):
            reducer.accept(path, "the path from where the divergence starts to where it takes its kind")
            return True
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


def origin_path(reducer, anchor: int, cone: set[int]) -> frozenset | None:
    """Nodes on the paths from the nearest origin upstream of ``anchor`` to it, or None."""
    upstream = [o for o in reducer.origins if o != anchor and o in cone]
    if not upstream:
        return None
    origin = max(upstream)  # the nearest in topological order
    path = frozenset(cone & reducer.index.descendants(origin, within=cone))
    return path if 1 < len(path) < len(reducer.best) else None
