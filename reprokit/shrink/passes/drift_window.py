"""drift window: the smallest contiguous stretch of the graph that still drifts on its own.

For an accumulated error no node, pair or region around a birth place shows the mismatch, but a
long enough stretch does: a topological window ``order[a:a+s]``, its cut inputs fed with the
captured reference activations, whose own outputs exceed the tolerance the same way. That is what
an upstream report or a platform team can run: the drift, without the rest of the model.

Windows of several sizes ride in one packed call (the evaluator decides how many fit): first
halves, quarters, eighths and sixteenths tiled over the whole graph with half-window strides; then,
inside the smallest window that drifts, its halves, quarters and eighths, and over the whole graph
the sizes 3/4 and 5/8 of it (neither inside a window judged already whose error stayed under half
the bar) — until no smaller window drifts or the rounds are spent. Each round
asks its windows smallest first and stops at the first pack that holds one that drifts (where
the memory bound splits a round, the larger windows after it cannot be the answer). The first
tiling rides in the pairs step's packs while they have room (:func:`ride`): once no node diverges
alone an accumulated verdict is likely, and the windows it needs are then known for no call.
Each round's call carries the next round of its windows as riders while it has room, the
likeliest hit's first (:func:`_next_rounds`): the round after the hit, usually the last one, which
finds nothing smaller, is then answered for no call.
The answer is reported, never accepted as the current best (it is not minimal in ddmin's sense:
every node in it contributes a little), and it is judged alone before anything is written
(``accumulated.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

ROUNDS = 4  # refinement rounds after the first tiling: each is one packed call, usually


@dataclass(frozen=True)
class Window:
    nodes: frozenset  # node indices of the reducer's model
    start: int  # position in the topological order
    size: int
    error: float | None
    of: int  # nodes in the order the window was cut from


def _tiles(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    """Windows of ``size`` over positions [lo, hi), half a window apart, the last flush at hi."""
    if size < 1 or hi - lo < size:
        return []
    step = max(1, size // 2)
    starts = list(range(lo, hi - size + 1, step))
    if starts[-1] != hi - size:
        starts.append(hi - size)
    return [(a, size) for a in starts]


def _ask(reducer, order: list[int], tiles: list[tuple[int, int]], known: list):
    """(the tiles asked, their outcomes): smallest first, stopping at the first pack with a hit —
    a later pack's larger windows cannot be smaller than that hit (windows left unjudged are
    None); none larger than a window already known to drift (``known``: each tile's cached
    outcome, one that rode along earlier)."""
    drifts = [s for (_, s), o in zip(tiles, known) if o is not None and o.interesting]
    if drifts:
        tiles = [t for t in tiles if t[1] <= min(drifts)]
    return tiles, reducer.verdicts([order[a:a + s] for a, s in tiles], stop_at_hit=True)


def first_tiles(n: int) -> list[tuple[int, int]]:
    """The first round: sixteenths, eighths, quarters and halves tiled over the whole graph,
    smallest first (the order the round asks them in)."""
    return [t for k in (16, 8, 4, 2) for t in _tiles(0, n, n // k)]


def ride(reducer) -> None:
    """The first round's windows ride in the next packed call while it has room (never a call
    of their own): their hits never stop that call's sequence of packs (``quiet``)."""
    order = reducer.ordered()
    if len(order) >= 4:
        reducer.ride_if_free([order[a:a + s] for a, s in first_tiles(len(order))], quiet=True)


def run(reducer, rounds: int = ROUNDS) -> Window | None:
    """The smallest window that shows the signature on its own, or None."""
    order = reducer.ordered()
    n = len(order)
    if n < 4:
        return None
    best: Window | None = None
    seen: dict[tuple[int, int], float] = {}  # (start, size) -> error of every window judged
    bar = reducer.severity or getattr(reducer.oracle.criterion, "tolerance", None)
    tiles = first_tiles(n)
    for _ in range(rounds + 1):
        tiles = sorted(dict.fromkeys(t for t in tiles if t[1] >= 1 and (best is None or t[1] < best.size)),
                       key=lambda t: t[1])
        if not tiles:
            break
        known = [reducer.cached(order[a:a + s]) for a, s in tiles]  # riders the round may not ask
        judged = list(zip(tiles, known))
        # the next round's windows for each window this round asks ride in its call while it has
        # room: where the hit is, its round is then answered for no call
        drifts = [s for (_, s), o in judged if o is not None and o.interesting]
        likely = [t for t in tiles if not drifts or t[1] <= min(drifts)]  # a larger one is never the hit
        reducer.ride_if_free([order[a:a + s] for a, s in _next_rounds(likely, n, seen, bar)], quiet=True)
        tiles, outcomes = _ask(reducer, order, tiles, known)
        reducer.take_riders()  # those that found no room (or no call to ride in) are asked when needed
        for tile, o in [*judged, *zip(tiles, outcomes)]:
            if o is not None and o.error is not None:
                seen[tile] = float(o.error)
        hits = [(s, -(o.error or 0.0), a) for (a, s), o in zip(tiles, outcomes) if o is not None and o.interesting]
        if not hits:
            break
        size, error, start = min(hits)  # the smallest size; among those the largest error
        best = Window(frozenset(order[start:start + size]), start, size, -error, n)
        tiles = _next_round(start, size, n, seen, bar)
    return best


def _inside(start: int, size: int, seen: dict, bar: float | None) -> list[tuple[int, int]]:
    """A window's halves, quarters and eighths, except those inside a window judged already
    whose error stayed under half the bar (a window of the first tiling, around the hit)."""
    return [t for k in (2, 4, 8) for t in _tiles(start, start + size, size // k) if _may_drift(t, seen, bar)]


def _shorter(size: int, n: int, seen: dict, bar: float | None) -> list[tuple[int, int]]:
    """Sizes between ``size`` and the next power down (3/4, 5/8) anywhere in the graph — a drift
    needs a length, not a place — except inside windows judged already whose error stayed under
    half the bar."""
    return [t for part in (3 * size // 4, 5 * size // 8) for t in _tiles(0, n, part) if _may_drift(t, seen, bar)]


def _next_round(start: int, size: int, n: int, seen: dict, bar: float | None) -> list[tuple[int, int]]:
    """The round after a hit at ``(start, size)``: its halves, quarters, eighths, and the shorter
    sizes anywhere in the graph (both only where a window judged around them leaves room)."""
    return _inside(start, size, seen, bar) + _shorter(size, n, seen, bar)


def _next_rounds(tiles: list[tuple[int, int]], n: int, seen: dict, bar: float | None) -> list[tuple[int, int]]:
    """Riders for a round asking ``tiles``: the round each of them would start were it the hit,
    the likeliest hit's first — the window whose smallest judged container drifted most (a
    window's error is mostly its length's drift: inside one far under the bar the hit is not),
    then the smaller — its insides, then the shorter sizes over the graph (shared by every
    window of one size); none twice, none this round asks."""
    asked = set(tiles)
    out: dict[tuple[int, int], None] = {}
    sizes: set[int] = set()
    for a, s in sorted(tiles, key=lambda t: (-_container_error(t, seen), t[1], t[0])):
        more = _inside(a, s, seen, bar) + ([] if s in sizes else _shorter(s, n, seen, bar))
        sizes.add(s)
        out.update(dict.fromkeys(t for t in more if t[1] >= 1 and t not in asked))
    return list(out)


def _container_error(tile: tuple[int, int], seen: dict) -> float:
    """The error of the smallest judged window that holds ``tile`` whole (-1: none does)."""
    a, size = tile
    around = [(length, error) for (b, length), error in seen.items() if b <= a and a + size <= b + length]
    return min(around)[1] if around else -1.0


def _may_drift(tile: tuple[int, int], seen: dict, bar: float | None) -> bool:
    """Can this window drift, going by the windows judged around it? A window's error is mostly
    the drift its length adds up (the premise of the pass), so inside a judged window whose error
    stayed under half the bar a shorter one is not asked (on PP-OCRv4 det the sizes-6-and-7
    tilings of the whole graph cost two calls for no hit: every 41-node window around them had a
    third of the bar or less). Half, not all of it: a shorter window's own outputs can drift more
    than its container's (there, 0.131 for 10 nodes inside 20 at 0.077). A window no judged one
    contains is asked."""
    if not bar or bar != bar:
        return True
    a, size = tile
    around = [error for (b, length), error in seen.items() if b <= a and a + size <= b + length]
    return not around or min(around) >= bar / 2
