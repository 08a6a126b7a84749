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
The marked run (the survey's marked copy: the target's own run of the whole model, every float
tensor an output) prunes and orders the windows (:func:`peaks`): a window's own error, fed with
the reference activations, is the part of the marked run's error its own nodes add (on PP-OCRv4
det under emulate:bf16 no window of 65 judged had more error alone than the marked run's largest
at its nodes; under openvino:bf16, where marking changes what the engine fuses, up to 1.14 times
it, inside the half-the-bar margin), so a window whose nodes stayed under half the bar in the marked run is not asked,
the shorter sizes elsewhere in the graph only where the marked run reaches the bar, and each
size's windows go the likeliest first. Packed by build cost a round asks the windows the marked
run puts over the bar first (each size a sequence of chunks that stop at the first hit) and the
others, in one pack, only where none of those drifts; the pass claims the calls that costs
(``Reducer.claim``). There the first tiling starts at eighths (``FIRST_BY_COST``), a size's
windows go by their nodes' own errors first (:func:`own_errors`), windows of nodes the engine ran
in fp32 alone are not asked, and the shorter sizes go over the graph only after the first hit.
The answer is reported, never accepted as the current best (it is not minimal in ddmin's sense:
every node in it contributes a little), and it is judged alone before anything is written
(``accumulated.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reprokit.shrink.passes import survey

ROUNDS = 4  # refinement rounds after the first tiling: each is one packed call, usually
# Packed by build cost the first tiling starts at eighths: each size's tiling builds about twice
# the model, and every sixteenth-window lies whole inside an eighth-window (half-window strides),
# which drifts too where the drift adds up (the premise of the pass): the round after its hit
# asks that hit's halves (PP-OCRv4 rec under openvino:bf16: the 31 sixteenths, 775 nodes, held
# no window that drifts).
FIRST_BY_COST = 8
# Packed by build cost, the rounds inside a hit ask each size's windows in one pack, not in the
# per-node fit's chunks (buildcost.TENSORRT.chunk_nodes: 3 windows of 6 nodes a call there): a
# window inside a hit holds a few heavy layers, a call's fixed part is worth ~7 of them
# (buildcost.ESTIMATE), and a round inside a hit usually finds nothing smaller, so every chunk of
# it is built anyway. PP-OCRv4 rec under openvino:bf16: the drift window 11 -> 7 calls, 69 -> 80
# heavy layers, est. 0.96 -> 0.84 s, the same 12-node window. The first tiling (eighths of the
# whole graph, 50 nodes each there) keeps its chunks: its hit comes early in the order.
REFINE_ONE_PACK = True


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


def _ask(reducer, order: list[int], tiles: list[tuple[int, int]], known: list, peak=None, bar=None,
         chunked: bool = True):
    """(the tiles asked, their outcomes): smallest first, stopping at the first pack with a hit —
    a later pack's larger windows cannot be smaller than that hit (windows left unjudged are
    None); none larger than a window already known to drift (``known``: each tile's cached
    outcome, one that rode along earlier). Packed by build cost, the tiles the marked run puts
    over the bar (``peak``) are asked first, until their first hit, each size a sequence of
    chunks (``chunked``, the first tiling) or of one pack (the rounds inside a hit: see
    :data:`REFINE_ONE_PACK`); only where none drifts the others, in one pack (where the budget
    leaves room for both)."""
    drifts = [s for (_, s), o in zip(tiles, known) if o is not None and o.interesting]
    if drifts:
        tiles = [t for t in tiles if t[1] <= min(drifts)]
    cut = lambda ts: [order[a:a + s] for a, s in ts]  # noqa: E731
    left = reducer.calls_left()
    likely = [t for t in tiles if peak is not None and bar and peak(t) >= bar]
    if reducer.build_cost is None or not likely or (left is not None and left < 4):
        return tiles, reducer.verdicts(cut(tiles), stop_at_hit=True)
    outcome: dict = {}
    pending = list(likely)
    while pending:
        # a size of its own sequence: where a window of it drifts no larger one is the hit, and a
        # chunk that held both would build the larger for nothing (PP-OCRv4 rec under
        # openvino:bf16: four 25-node windows in the call of the 12-node hit); where the budget
        # runs short the sizes left go in one sequence
        left = reducer.calls_left()
        group = [t for t in pending if t[1] == pending[0][1]] if left is None or left >= 4 else pending
        pending = pending[len(group):]
        outcome.update(zip(group, reducer.verdicts(cut(group), stop_at_hit=chunked)))
        if any(outcome[t] is not None and outcome[t].interesting for t in group):
            break
    hits = [t[1] for t, o in outcome.items() if o is not None and o.interesting]
    # where one of them drifts, a window the marked run leaves under the bar is not asked (it
    # would have to add more error alone than the whole model's run shows at its nodes; the
    # smaller ones over the bar were asked before the hit); where none does, the others are
    rest = [] if hits else [t for t in tiles if t not in outcome]
    if rest:  # a miss is likely here: one pack of them all, not chunks that each pay a call
        outcome.update(zip(rest, reducer.verdicts(cut(rest))))
    return tiles, [outcome.get(t) for t in tiles]


def first_tiles(n: int, peak=None, bar: float | None = None, finest: int = 16) -> list[tuple[int, int]]:
    """The first round: sixteenths, eighths, quarters and halves tiled over the whole graph (from
    ``finest`` on), smallest first (the order the round asks them in), each size's likeliest
    first and none the marked run leaves far under the bar (``peak``: :func:`peaks`)."""
    tiles = [t for k in (16, 8, 4, 2) if k <= finest for t in _tiles(0, n, n // k)]
    return _likeliest_first([t for t in tiles if _marked_may_drift(t, peak, bar)], peak)


def ride(reducer) -> None:
    """The first round's windows ride in the next packed call while it has room (never a call
    of their own): their hits never stop that call's sequence of packs (``quiet``)."""
    order = reducer.ordered()
    if len(order) >= 4:
        peak, bar = peaks(reducer, order), _bar(reducer)
        reducer.ride_if_free([order[a:a + s] for a, s in first_tiles(len(order), peak, bar)], quiet=True)


def _bar(reducer) -> float | None:
    return reducer.severity or getattr(reducer.oracle.criterion, "tolerance", None)


def peaks(reducer, order: list[int]):
    """``peak((start, size))``: the largest error the marked run saw at the window's nodes'
    float outputs (its judged error, the run's metric); None without a marked run, or where the
    windows are judged in quantization steps. A node whose
    tensor the target did not return counts as unbounded (no evidence), one without a float
    output as 0 (it rounds nothing)."""
    report = getattr(reducer, "layerwise_report", None)
    if report is None or not report.rows or getattr(reducer.oracle, "quant", None) is not None:
        return None  # a quantized run judges its outputs in quantization steps, the marked rows are not
    seen = {row.tensor: float(row.error.error) for row in report.rows}
    missing = set(report.missing)

    def error(t: str) -> float:
        if t in missing:
            return math.inf
        e = seen.get(t, 0.0)
        return math.inf if e != e else e

    at = [max((error(t) for t in reducer.index.node_outputs[i]), default=0.0) for i in order]
    return lambda tile: max(at[tile[0]:tile[0] + tile[1]], default=0.0)


def _marked_may_drift(tile: tuple[int, int], peak, bar: float | None, share: float = 0.5) -> bool:
    """Can this window drift, going by the marked run? Not where the largest error the marked run
    saw at its nodes stayed under ``share`` of the bar (half by default: the margin
    :func:`_may_drift` keeps too)."""
    return peak is None or not bar or bar != bar or peak(tile) >= bar * share


def _likeliest_first(tiles: list[tuple[int, int]], peak, own=None) -> list[tuple[int, int]]:
    """Smallest first, and within a size the largest own error first (``own``: :func:`own_errors`,
    packed by build cost), then the largest marked-run error (stable)."""
    return sorted(tiles, key=lambda t: (t[1], -own(t) if own is not None else 0.0,
                                        -peak(t) if peak is not None else 0.0))


def _rounds_nothing(reducer, order: list[int], bar: float | None):
    """``rounds_nothing((start, size))``: did every node of the window stay within float32
    rounding of the reference alone in the survey (``survey.rounds_nothing_alone``: the engine
    ran it in fp32)? Packed by build cost such a window is not asked: with no node that rounds to
    a narrow type it cannot drift (PP-OCRv4 rec under openvino:bf16: 8 such windows judged, each
    under 2e-7 at a bar of 0.01)."""
    if not bar or bar != bar or bar < survey.EXACT_RULE_FROM:  # float32 rounding could matter there
        return lambda tile: False
    fp32 = [survey.rounds_nothing_alone(reducer, i) for i in order]
    return lambda tile: all(fp32[tile[0]:tile[0] + tile[1]])


def own_errors(reducer, order: list[int]):
    """``own((start, size))``: the root of the sum of squares of the window's nodes' own errors
    in the survey (each fed the reference's values; a node not judged alone counts 0). Rounding
    errors of independent nodes add in quadrature, so it is what the window adds without its
    nodes' gains — a guide to the likeliest hit where the marked run is over the bar almost
    everywhere (PP-OCRv4 rec under openvino:bf16 at 0.01: the hit was the 9th eighth-window by
    the marked run, the 3rd by this)."""
    squares = [0.0]
    for i in order:
        outcome = reducer.isolated.get(i)
        error = 0.0 if outcome is None or outcome.error is None else float(outcome.error)
        squares.append(squares[-1] + (error * error if error == error and error != math.inf else 0.0))
    return lambda tile: math.sqrt(max(0.0, squares[min(len(order), tile[0] + tile[1])] - squares[tile[0]]))


def run(reducer, rounds: int = ROUNDS) -> Window | None:
    """The smallest window that shows the signature on its own, or None."""
    order = reducer.ordered()
    n = len(order)
    if n < 4:
        return None
    best: Window | None = None
    seen: dict[tuple[int, int], float] = {}  # (start, size) -> error of every window judged
    bar = _bar(reducer)
    peak = peaks(reducer, order)
    rounds_nothing = _rounds_nothing(reducer, order, bar) if reducer.build_cost is not None else (lambda t: False)
    may = lambda t: _marked_may_drift(t, peak, bar) and not rounds_nothing(t)  # noqa: E731
    if reducer.build_cost is not None and peak is not None:
        reducer.claim(3 * (rounds + 1))  # each round's sequences (_ask): a size each, the rest
    by_cost = reducer.build_cost is not None
    own = own_errors(reducer, order) if by_cost else None
    tiles = first_tiles(n, peak, bar, FIRST_BY_COST if by_cost else 16)
    for _ in range(rounds + 1):
        tiles = _likeliest_first(dict.fromkeys(t for t in tiles if t[1] >= 1 and (best is None or t[1] < best.size)
                                               and may(t)), peak, own)
        if not tiles:
            break
        known = [reducer.cached(order[a:a + s]) for a, s in tiles]  # riders the round may not ask
        judged = list(zip(tiles, known))
        # the next round's windows for each window this round asks ride in its call while it has
        # room: where the hit is, its round is then answered for no call
        drifts = [s for (_, s), o in judged if o is not None and o.interesting]
        likely = [t for t in tiles if not drifts or t[1] <= min(drifts)]  # a larger one is never the hit
        if reducer.build_cost is None:  # by build cost a rider pays up to 4 nodes: here, hundreds of them
            reducer.ride_if_free([order[a:a + s] for a, s in _next_rounds(likely, n, seen, bar, peak) if may((a, s))],
                                 quiet=True)
        chunked = best is None or not REFINE_ONE_PACK  # the first tiling; or the rounds inside a hit
        tiles, outcomes = _ask(reducer, order, tiles, known, peak, bar, chunked=chunked)
        reducer.take_riders()  # those that found no room (or no call to ride in) are asked when needed
        for tile, o in [*judged, *zip(tiles, outcomes)]:
            if o is not None and o.error is not None:
                seen[tile] = float(o.error)
        hits = [(s, -(o.error or 0.0), a) for (a, s), o in zip(tiles, outcomes) if o is not None and o.interesting]
        if not hits:
            break
        size, error, start = min(hits)  # the smallest size; among those the largest error
        # by build cost the shorter sizes go over the graph after the first tiling's hit only:
        # below an eighth every window lies inside one of that tiling, judged already
        elsewhere = not by_cost or best is None
        best = Window(frozenset(order[start:start + size]), start, size, -error, n)
        tiles = _next_round(start, size, n, seen, bar, peak, elsewhere)
    return best


def _inside(start: int, size: int, seen: dict, bar: float | None) -> list[tuple[int, int]]:
    """A window's halves, quarters and eighths, except those inside a window judged already
    whose error stayed under half the bar (a window of the first tiling, around the hit)."""
    return [t for k in (2, 4, 8) for t in _tiles(start, start + size, size // k) if _may_drift(t, seen, bar)]


def _shorter(size: int, n: int, seen: dict, bar: float | None, peak=None) -> list[tuple[int, int]]:
    """Sizes between ``size`` and the next power down (3/4, 5/8) anywhere in the graph — a drift
    needs a length, not a place — except inside windows judged already whose error stayed under
    half the bar, and (with a marked run, ``peak``) where the marked run stayed under the bar
    itself: a window smaller than one that drifts already would have to add more error alone
    than the whole model's run shows at its nodes (PP-OCRv4 det under openvino:bf16: 1,507 nodes
    of 61- and 51-node windows asked for no hit, none of them over the bar in the marked run)."""
    return [t for part in (3 * size // 4, 5 * size // 8) for t in _tiles(0, n, part)
            if _may_drift(t, seen, bar) and _marked_may_drift(t, peak, bar, share=1.0)]


def _next_round(start: int, size: int, n: int, seen: dict, bar: float | None, peak=None,
                elsewhere: bool = True) -> list[tuple[int, int]]:
    """The round after a hit at ``(start, size)``: its halves, quarters, eighths, and (where
    ``elsewhere``) the shorter sizes anywhere in the graph (both only where a window judged around
    them leaves room)."""
    return _inside(start, size, seen, bar) + (_shorter(size, n, seen, bar, peak) if elsewhere else [])


def _next_rounds(tiles: list[tuple[int, int]], n: int, seen: dict, bar: float | None,
                 peak=None) -> list[tuple[int, int]]:
    """Riders for a round asking ``tiles``: the round each of them would start were it the hit,
    the likeliest hit's first — the window whose smallest judged container drifted most (a
    window's error is mostly its length's drift: inside one far under the bar the hit is not),
    then the smaller — its insides, then the shorter sizes over the graph (shared by every
    window of one size); none twice, none this round asks."""
    asked = set(tiles)
    out: dict[tuple[int, int], None] = {}
    sizes: set[int] = set()
    for a, s in sorted(tiles, key=lambda t: (-_container_error(t, seen), t[1], t[0])):
        more = _inside(a, s, seen, bar) + ([] if s in sizes else _shorter(s, n, seen, bar, peak))
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
