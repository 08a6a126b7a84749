"""localize: start where the divergence starts.

The survey names anchor nodes (the first tensors that show the signature's kind while their
inputs do not, from the marked run) and origins (nodes that diverge in any way: first in the
marked run, or on their own in the isolated survey). The region that reproduces is usually short:
the path from the nearest origin to the anchor (a variance that overflows upstream of the
mismatch it causes), a window growing backwards from the anchor inside its ancestor cone, or a
window growing forwards from an origin among its descendants. Widths grow exponentially (1, 2,
4 …), so the whole ladder is about log2 of the graph — and every rung is one candidate of ONE
request: packed oracles answer it in one engine call, the earliest (smallest) rung wins.

Each small rung's ddmin deletions (halves, quarters … single nodes) ride along in that call, so
the next step (ddmin, 1-minimality) usually finds its answers cached. Once a region is accepted, its anchor must stay
in every later candidate: a reduction never slips from this fault to another one elsewhere.
"""

from __future__ import annotations

from reprokit.engine.oracle import Kind
from reprokit.graph.extract import NotCaptured
from reprokit.shrink.passes import ddmin, shapes

# Rungs up to this many nodes bring their "minus one node" candidates along (build work grows
# with the square of the size, so only small ones).
SPECULATE_UP_TO = 8
# The widest rung: localization looks for SMALL regions; a wider one is the search's business.
MAX_WIDTH = 32
# Rungs whose input crops ride along in localization's call (the smallest: the likeliest winners).
CROP_RUNGS = 12


def run(reducer) -> bool:
    """Accept the smallest reproducing region around an anchor or an origin; True when found."""
    best = set(reducer.best)
    anchors, origins = _births(reducer)
    rungs: list[tuple[frozenset, str, int | None]] = []
    for anchor in [a for a in anchors if a in best][:1]:
        cone = sorted(reducer.index.ancestors(anchor, within=best))
        path = origin_path(reducer, anchor, set(cone))
        if path:
            rungs.append((path, "the path from where the divergence starts to where it takes its kind", anchor))
        for width in _widths(len(cone)):
            rungs.append((frozenset(cone[-width:]), f"region of {width} nodes ending at the anchor", anchor))
    for origin in [o for o in origins if o in best][:2]:
        ahead = sorted(reducer.index.descendants(origin, within=best))
        for width in _widths(len(ahead)):
            rungs.append((frozenset(ahead[:width]), f"region of {width} nodes starting where it diverges", origin))
    rungs = [r for r in dict((r[0], r) for r in rungs).values() if reducer.smaller(r[0])]
    rungs.sort(key=lambda r: len(r[0]))  # the smallest reproducing region wins
    if not rungs:
        return False
    # a rung's deletions and crops are asked only if that rung wins (about one chance in the rungs):
    # packed by build cost they ride only where even a one-node rider pays at those odds
    cost = reducer.build_cost
    if cost is None or cost.rider_pays(1, 1 / len(rungs)):
        reducer.also_judge([c for r in rungs if len(r[0]) <= SPECULATE_UP_TO for c in ddmin.deletions(sorted(r[0]))])
    if reducer.shapes and reducer.packing == "numeric" and (cost is None or cost.rider_pays(1, 1 / len(rungs))):
        _speculate_crops(reducer, [r[0] for r in rungs if len(r[0]) <= SPECULATE_UP_TO][:CROP_RUNGS])
    hit = reducer.first_interesting([r[0] for r in rungs])
    if hit is None:
        return False
    region, why, anchor = rungs[hit]
    reducer.accept(region, why)
    if anchor is not None and reducer.signature.kind.value in ("nonfinite", "mismatch"):
        reducer.required = frozenset([anchor])
    return True


def _births(reducer) -> tuple[list[int], list[int]]:
    """(anchors, origins) the regions grow from. Packed by build cost a mismatch's regions grow
    only from the nodes that diverge alone — the births that let localize run for a mismatch at
    all (``pipeline._born_somewhere``) — not from the marked run's anchors and first diverging
    tensors: where the error adds up, those are only where the marked run first crosses the bar
    (PP-OCRv4 rec under openvino:bf16: nodes 11 and 19, 148 nodes of regions judged, while the
    one node that diverges alone is node 239). By count the rungs ride in calls that come anyway."""
    if reducer.build_cost is None or reducer.signature.kind is not Kind.MISMATCH:
        return reducer.anchors, reducer.origins
    alone = [i for i, o in sorted(reducer.isolated.items()) if o.kind in (Kind.MISMATCH.value, Kind.NONFINITE.value)]
    return [], alone


def _speculate_crops(reducer, regions: list[frozenset]) -> None:
    """The input crops of the smallest rungs ride in the same call (where the pack has room): the
    rung accepted finds its shapes judged, and the run saves the shapes pass's own call."""
    ready = []
    for region in regions:
        try:
            sub = reducer.extraction(region, check=False)
        except NotCaptured:
            continue  # cuts at a value the capture has none of: no crops for it
        if sub.outputs and reducer.unrepresentable_feed(sub.feeds) is None:
            ready.append((region, sub, {n: reducer.store.get(n) for n in sub.outputs if n in reducer.store}))
    shapes.Shapes(reducer, frozenset(), reducer.workdir).speculate(ready)


def _widths(size: int) -> list[int]:
    widths, width = [], 1
    while width < min(size, MAX_WIDTH):
        widths.append(width)
        width *= 2
    return widths + [min(size, MAX_WIDTH)]


def origin_path(reducer, anchor: int, cone: set[int]) -> frozenset | None:
    """Nodes on the paths from the nearest origin upstream of ``anchor`` to it, or None."""
    upstream = [o for o in reducer.origins if o != anchor and o in cone]
    if not upstream:
        return None
    origin = max(upstream)  # the nearest in topological order
    path = frozenset(cone & reducer.index.descendants(origin, within=cone))
    return path if len(path) > 1 and reducer.smaller(path) else None
