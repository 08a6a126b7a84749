"""conflict: the k nodes that fail only together, by a progressive conflict-set search.

When no single node shows the bug alone, the nodes interact: a check that fails only when two
distant nodes are both in the model, a fusion that needs a producer→consumer edge intact (a Conv
whose only reader is a Clip), an error that needs a chain to build up. Growing unions spends calls
on sets that are almost the whole model; bisecting a contiguous window (polygraphy) keeps
everything between the two ends.

The search works on the nodes in topological order, every candidate judged alone through the
Reducer's cache (what the survey judged costs nothing):

1. the **last necessary node** ``b``: the smallest failing prefix, by bisection (the whole is
   known to fail): ⌈log2 n⌉ calls. A prefix is a window of the graph, so a fusion is intact in it;
2. does what is found fail alone? Then it is the answer (for k = 2 this question is the result
   judged alone, so the final judgement comes from the cache);
3. a **fusion first**: ``b`` with its direct producers, one call — a failing fusion ends here;
4. else the **earliest necessary node** of the rest: the largest s such that the found nodes with
   the window ``rest[s:]`` still fail, by bisection (⌈log2 |rest|⌉ calls); the nodes after it are
   kept as background, so a third or fourth necessary node is never lost. Back to 2 — except
   when at most ``DENSE`` nodes are left between two necessary ones: each is then left out in
   turn (a chain that needs all of them, a LayerNorm-like fusion, costs one call a node).

A pair costs at most 2⌈log2 n⌉ + 3 calls, the result judged alone included (8 + 1 + 7 + 1 for
a pair among 160 nodes, against the ⌈log2 C(160, 2)⌉ = 14 bits that any exact method needs from
a 1-bit check; a fusion ⌈log2 n⌉ + 1); k nodes, for k ≤ √n, at most QuickXplain's
2k·⌈log2(n/k)⌉ + 2k (Junker 2004), which :func:`quickxplain` keeps for larger sets (the search
switches to it once more than √n nodes are found). Measured against QuickXplain alone over 160
nodes: a distant pair 17 calls on average vs 20, a fusion 9 vs 13, three scattered nodes 25 vs
28, a chain of nine 23 vs 27.

From ``HALVE_FROM`` nodes on, windows are halved first (:func:`halve`), cut at the power of two
nearest the middle (:func:`_cut`). Both searches run first over the nodes that compute from the
model's inputs (:func:`computed`: a torch export's constant subgraphs are most of its nodes, fed as
initializers where a window leaves them out), then, when that answer does not fail alone, over
every node.

In a quantized model the searches work on Q/DQ units (:func:`_atoms`): a unit stands as its first
node, every question holds it whole (:func:`whole_units`), and an op's producers are named by the
units that feed it. A window cut through a unit is an invalid candidate that the searches would
read as a pass (on the quantized rapidocr classifier: 126 calls, each window one node smaller).

The result is verified alone before it is accepted (usually from the cache): a check that is not
monotone (a node set that fails while a superset passes) can make the search end on a set that
does not fail; it is then left to the window and ddmin passes, and counted as a contradiction.
"""

from __future__ import annotations

import math

from reprokit.shrink.evaluator import Outcome
from reprokit.shrink.reducer import BudgetExhausted

DENSE = 8  # at most this many nodes left between two necessary ones: each is left out in turn
# From this many nodes on, windows are halved first (:func:`halve`): a prefix bisection builds
# about b·log2 n nodes (b: the last necessary node's place), halving about 1.5·n, for about half
# a call more a level; below it the calls weigh more than the nodes (issue 39: est. build seconds)
HALVE_FROM = 64


def bound(n: int, k: int = 2) -> int:
    """QuickXplain's worst case for k necessary nodes among n: 2k·⌈log2(n/k)⌉ + 2k calls."""
    return 2 * k * math.ceil(math.log2(max(2, n / k))) + 2 * k


def allowance(n: int, computing: int = 0) -> int:
    """What the search claims on top of the auto budget's bisection over n nodes: its bound for
    a pair (k = 2) and, where it halves windows first (n ≥ ``HALVE_FROM``), the halving's worst
    case (two calls a level, then one a level for each side, the pair judged alone); where the
    ``computing`` nodes (:func:`computed`) are searched first, that search's own bound and its
    answer judged alone as well, so that the search over every node after a miss still fits."""
    own = bound(n) - 2 * math.ceil(math.log2(n + 1)) + _halving(n)
    return own + (bound(computing) + _halving(computing) + 1 if computing else 0)


def _halving(n: int) -> int:
    return 4 * math.ceil(math.log2(n)) + 1 if n >= HALVE_FROM else 0


def run(reducer) -> bool:
    """Accept a minimal set of nodes that shows the signature alone; True when found."""
    whole = whole_units(reducer)
    order = _atoms(reducer, reducer.ordered())
    if len(order) < 3:
        return False
    data = computed(reducer, order)
    reducer.claim(allowance(len(order), len(data) if data is not None else 0))
    smallest: list[frozenset] = []

    def narrowed(nodes: frozenset) -> None:  # a window seen failing alone: kept should the search stop
        if not smallest or len(nodes) < len(smallest[0]):
            smallest[:] = [nodes]

    def keep_smallest() -> None:
        # accepted once the search stops, not as it closes in: accepting is where a check command
        # that has passed no call yet is probed (steps._probe), and the search's later calls
        # usually pass one (polygraphy's --no-reduce-inputs row: 2 calls, not 3)
        if smallest and reducer.smaller(smallest[0]):
            reducer.accept(smallest[0], "a window that fails alone (conflict-set search)")

    passed: list[frozenset] = []

    def seen() -> frozenset | None:
        return smallest[0] if smallest else None

    def asked(nodes: frozenset) -> bool:
        nodes = whole(nodes)
        if reducer.test(nodes):
            narrowed(nodes)
            return True
        passed.append(nodes)
        return False

    try:
        producers = _producers(reducer, order)
        found = None
        if data is not None:  # the computing nodes first; a miss is no contradiction
            found = _find(asked, data, producers, seen, known=False)
            if found is not None and not reducer.test(whole(found)):
                found = None  # a node of a constant subgraph is needed: every node, as before
        if found is None:
            found = _find(asked, order, producers, seen)
    except BudgetExhausted:
        keep_smallest()  # a run stopped at the budget keeps the smallest failing window
        raise
    if found is None:
        keep_smallest()
        return False
    found = whole(found)
    if not reducer.test(found):  # from the cache when the search's last question was this set
        reducer.contradictions += 1  # the search's own answers disagree: not monotone, or flaky
        keep_smallest()
        return False
    if reducer.smaller(found):
        reducer.accept(found, f"{len(found)} nodes that fail only together (conflict-set search)")
    _clear_inside_passes(reducer, found, passed)
    return found == reducer.best


def _find(asked, order: list[int], producers, seen=None, known: bool = True) -> frozenset | None:
    """Halving from ``HALVE_FROM`` nodes on, else (or when the halves' answers left no set that
    fails alone) the bisection over all of ``order``, its repeated questions cached. ``known``:
    all of ``order`` is known to fail; else it is asked before the bisection, which assumes it
    (None when it passes), and a halving that ends on a set that does not fail costs no more.
    ``seen()`` (optional): the smallest set seen failing so far; after a halving that missed (more
    than one necessary node on a side: a chain fusion with a distant partner) the bisection runs
    inside it, not over all of ``order`` again (the quantized rapidocr classifier: issue 39)."""
    found = None
    if len(order) >= HALVE_FROM:
        found = halve(asked, order, producers=producers)
        if found is not None:
            return found
        window = seen() if seen is not None else None
        inside = [node for node in order if window is not None and node in window]
        if inside and len(inside) < len(order):
            return search(asked, inside, producers)
    if not known and not asked(frozenset(order)):
        return None
    return search(asked, order, producers)


def computed(reducer, order: list[int]) -> list[int] | None:
    """The nodes of ``order`` that compute from the model's inputs, or None when that is all of
    them (or too few to search). A torch export's constant subgraphs — ``Constant`` nodes, the
    shape arithmetic of every ``Pad`` — are most of its nodes (MobileNetV2: 942 of 1,094); a
    window without them is fed their values as initializers (graph/extract.py), as a folded
    model is, so a build error or fusion among the computing nodes shows the same and each
    question builds a fraction of the nodes. A quantized constant (a bias's QuantizeLinear →
    DequantizeLinear unit) counts as computing: an engine's int8 transformations match the Q/DQ
    pattern, which a folded float initializer is not (a 1,185-node QDQ classifier's build error
    needs its bias unit: without it the first search could only miss, issue 39). Searched first;
    a search whose answer does not fail alone (a node of a constant subgraph is needed) is
    followed by the search over every node."""
    index = reducer.index
    if index is None:
        return None
    units = index.units or {}
    data = [n for n in order if n in units or any(t not in index.constants for t in index.node_outputs[n])]
    return data if 3 <= len(data) < len(order) else None


def _clear_inside_passes(reducer, found: frozenset, passed: list[frozenset]) -> None:
    """The result less one node lies inside a set the search saw pass: under the search's own
    assumption (a subset of a passing set passes) it passes too, journaled as inferred, as a
    group test's cleared members are — ddmin's 1-minimality sweep and the branches' cones then
    ask no call for it (the survey's packs said so of single nodes where it ran)."""
    for node in found:
        rest = found - {node}
        if rest and reducer.cached(rest) is None and any(rest <= seen for seen in passed):
            reducer.record(rest, Outcome(False, "agree", "inside a set that passed (conflict-set search)", None,
                                         inferred=True))


def _atoms(reducer, order: list[int]) -> list[int]:
    """``order`` with each Q/DQ unit down to its first node (:func:`whole_units` puts the rest
    back in every question): the searches bisect units, never a unit's halves — a window of a
    unit's Q alone is the unit again, a question asked twice."""
    units = getattr(reducer.index, "units", None)
    if not units:
        return order
    seen: set[int] = set()
    kept = []
    for node in order:
        if node in units:
            if units[node] & seen:
                continue
            seen.update(units[node])
        kept.append(node)
    return kept


def whole_units(reducer):
    """nodes → nodes with every Q/DQ unit they touch whole (GraphIndex.units). Every question is
    asked so: a window cut through a unit is invalid (known.py), and read as a pass it told the
    bisections that each node before the cut was needed — a 1,185-node QDQ classifier's build
    error took 126 calls, each window one node smaller (issue 39). Closing is monotone, so the
    searches' assumption (a superset of a failing set fails) holds for the closed question."""
    units = getattr(reducer.index, "units", None)
    if not units:
        return frozenset

    def whole(nodes) -> frozenset:
        closed = set(nodes)
        for node in nodes:
            closed.update(units.get(node, ()))
        return frozenset(closed)
    return whole


def _producers(reducer, order: list[int]):
    """node → the nodes that produce its inputs (the fusion guess); None without a graph index.
    In a quantized model a node of ``order`` stands for its Q/DQ unit (:func:`_atoms`): what feeds
    any node of the unit, named by the node of ``order`` that stands for it — an op's producers
    are DequantizeLinear nodes, which never stand for their unit (its Q comes first)."""
    index = reducer.index
    if index is None:
        return None
    units = index.units or {}
    stands = {member: node for node in order for member in units.get(node, (node,))}

    def producers(node: int) -> set[int]:
        found = set()
        for member in units.get(node, (node,)):
            for tensor in index.node_inputs[member]:
                p = index.producer.get(tensor)
                if p is not None and stands.get(p, p) != node:
                    found.add(stands.get(p, p))
        return found
    return producers


def _heard(test, narrowed):
    """``test`` as a predicate on any iterable of nodes, telling ``narrowed`` (optional) each set it
    held on."""
    def fails(nodes) -> bool:
        nodes = frozenset(nodes)
        if test(nodes):
            if narrowed is not None:
                narrowed(nodes)
            return True
        return False
    return fails


def search(test, order: list[int], producers=None, narrowed=None) -> frozenset | None:
    """A minimal subset of ``order`` for which ``test`` holds, assuming it holds on all of
    ``order`` and is monotone. ``test`` takes a frozenset; ``producers(node)`` (optional) names
    the nodes feeding ``node``, tried first as its partners; ``narrowed(nodes)`` (optional) hears
    each set that ``test`` held on, as the search closes in."""
    if not order:
        return None
    fails = _heard(test, narrowed)

    position = {node: i for i, node in enumerate(order)}
    high = _first(1, len(order), lambda length: fails(order[:length]))  # the smallest failing prefix
    found = [order[high - 1]]
    rest = order[:high - 1]  # found ∪ rest fails: the rest of a minimal set lies here
    guess = producers is not None
    while rest:
        if fails(found):
            return frozenset(found)
        if len(found) * len(found) > len(order):  # many nodes: QuickXplain's bound is the better one
            return frozenset(found) | quickxplain(lambda s: fails(s | frozenset(found)), rest, known=False)
        if guess:
            guess = False  # once, for the last necessary node: a fusion of it with what feeds it
            near = sorted((p for p in producers(found[0]) if p in position and position[p] < high - 1),
                          key=position.get)
            if near and len(near) < len(rest) and fails(set(found) | set(near)):
                rest = near
                continue
        if len(found) >= 2 and len(rest) <= DENSE:
            return frozenset(found) | _complements(fails, found, rest)
        # the latest s with found ∪ rest[s:] failing (s = 0 does): rest[s] is the earliest needed one
        last = len(rest) - 1
        tail = lambda back, rest=rest, last=last: fails(set(found) | set(rest[last - back:]))  # noqa: E731
        first = last - _first(0, last, tail)
        found.append(rest[first])
        rest = rest[first + 1:]
    return frozenset(found)


def halve(test, order: list[int], producers=None, narrowed=None) -> frozenset | None:
    """A small set of ``order`` that fails alone, by halving windows, or None. Each question keeps a
    window of the graph (a fusion inside it stays intact) and builds only that window: while one
    half of the current window fails alone the search goes down it (one call, two when the first
    half passes). When neither half fails, a necessary node lies on each side (a distant pair, or a
    fusion the cut went through): :func:`_straddle` narrows both sides. About 1.5·n nodes built for
    a fusion or a single, 2·n for a pair across the halves, where the prefix bisection of
    :func:`search` builds b·log2 n. None when the end set does not fail alone (more than one
    necessary node on a side): :func:`search` then starts over, its repeated questions cached."""
    fails = _heard(test, narrowed)

    window = list(order)
    while len(window) > 1:
        half = _cut(len(window))
        first, second = window[:half], window[half:]
        if fails(first):
            window = first
        elif fails(second):
            window = second
        else:
            return _straddle(fails, first, second, producers)
    return frozenset(window)


def _cut(size: int) -> int:
    """Where a window of ``size`` nodes is cut: at the power of two nearest its middle, so that one
    side halves down with no ragged level. A pair across the cut is narrowed in ⌈log2 a⌉ +
    ⌈log2 b⌉ questions (a, b: the sides), a single in ⌈log2⌉ levels of its side: 160 nodes cut
    64 + 96 take 6 + 7 where 80 + 80 took 7 + 7. Over 150 random pairs of a 160-node chain and
    of BERT's 144 computing nodes: at most 16 calls where halves took 17, 14.5–15.0 on average
    (14.3–14.9); MobileNetV2's 35 Conv→Clip fusions: 12.1 calls and 250 nodes (12.0, 237)."""
    power = 1
    while power * 2 < size:
        power *= 2
    return power if power - size / 2 <= size / 2 - power // 2 else power // 2


def _straddle(fails, early: list[int], late: list[int], producers=None) -> frozenset | None:
    """Neither ``early`` nor ``late`` fails alone, together they do: one necessary node on each
    side is assumed (checked at the end). The larger side (the later on a tie) is halved, one half
    of it asked with the whole other side: a pass points at the other half. Once the later side is
    one node, its producers on the early side are asked first (a fusion cut in two). Each question
    builds the two sides as they are: the sizes fall by half a question. Returns the pair (asked
    alone, usually as the last question), or None when it does not fail alone."""
    guess = producers is not None
    seen = False  # the last question failed on exactly the sides as they now are
    while len(early) > 1 or len(late) > 1:
        if guess and len(late) == 1:
            guess = False
            near = [node for node in early if node in producers(late[0])]
            if near and len(near) < len(early) and fails(near + late):
                early, seen = near, True
                continue
        if len(late) >= len(early):
            part = late[:len(late) // 2]
            seen = fails(early + part)
            late = part if seen else late[len(late) // 2:]
        else:
            part = early[len(early) // 2:]  # the later half first: nearer the other side
            seen = fails(part + late)
            early = part if seen else early[:len(early) // 2]
    found = frozenset(early + late)
    return found if seen or fails(found) else None


def _first(low: int, high: int, holds) -> int:
    """The smallest i in [low, high] for which ``holds(i)``, by bisection; ``holds`` is monotone
    (false, then true) and known to hold at ``high``."""
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return high


def _complements(fails, found: list[int], rest: list[int]) -> frozenset:
    """The few nodes left between the first and the last necessary one, each left out in turn
    (one call each): a chain that needs all of them (a LayerNorm-like fusion) costs one call a
    node here, against a bisection for each."""
    keep = list(rest)
    for node in rest:
        trial = [other for other in keep if other != node]
        if fails(set(found) | set(trial)):
            keep = trial
    return frozenset(keep)


def quickxplain(test, order: list[int], known: bool = True) -> frozenset:
    """A minimal subset of ``order`` for which ``test`` holds, assuming it holds on all of
    ``order`` and is monotone (a superset of a failing set fails). ``test`` takes a frozenset;
    ``known``: False when ``test`` may already hold on the empty set."""
    if not order:
        return frozenset()
    return frozenset(_qx(test, frozenset(), not known, list(order)))


def _qx(test, background: frozenset, asked: bool, candidates: list[int]) -> list[int]:
    """Junker's QX: the part of ``candidates`` that ``background`` needs to fail. ``asked``:
    ``background`` grew since the last question, so it may fail on its own already."""
    if asked and test(background):
        return []
    if len(candidates) == 1:
        return candidates
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    # the later half first: with the earlier half as background, what of the later one is needed
    needed_second = _qx(test, background | frozenset(first), True, second)
    needed_first = _qx(test, background | frozenset(needed_second), bool(needed_second), first)
    return needed_first + needed_second
