"""survey: every node alone, then every producer→consumer pair, fed with reference activations.

This is the isolated layerwise view: each node's own error with no accumulation from upstream,
and in pairs the fusion of two neighbours intact (Conv→Clip, MatMul→Add). Most real faults live
in one or two nodes, so the earliest single that shows the signature alone, else (numeric) the
pair that shows it whose nodes erred most alone, is the answer — and it is 1-minimal at once,
since its parts were judged too.

For numeric oracles the whole survey is one packed call (a few when the pack limits split it)
and the marked layerwise run (every tensor of the whole model marked, where the signature's kind
first appears) rides along in the same call. A model whose weights pass half a pack runs the
marked model alone first and judges nodes nearest its anchor first, stopping at the first pack
that holds a hit: memory stays that of one run of the model. Packed by build cost (TensorRT) the
singles go in chunks that stop at the first hit, the nodes where an overflow or underflow is born
first, and the marked copy waits until a step after the pairs needs it (``anchor_now``); no pair
whose producer computed the reference exactly alone is built (:func:`consumer_alone`).
For pass/fail oracles the same candidates are
group-tested, singles only: nodes that fail only together (a pair, a fusion) are the conflict
search's (``conflict.py``), which needs fewer calls than a group test over every edge.
Each node's isolated outcome is kept for attribution when no small window diverges alone.
"""

from __future__ import annotations

import math

from reprokit.engine.oracle import Kind


def _region(reducer, i: int) -> frozenset:
    """Node ``i`` as the survey judges it: alone, or in a quantized model with its Q/DQ units
    (GraphIndex.region); an index-free reducer (pure algorithm tests) judges it alone."""
    index = reducer.index
    return index.region(i) if getattr(index, "regions", None) else frozenset([i])


def run(reducer, *, layerwise: bool) -> bool:
    """Accept the earliest single that reproduces alone; True when one was found. Numeric
    oracles' pairs ride in the same call and are taken by the pairs step (:func:`pairs`);
    pass/fail ones leave pairs to the conflict search."""
    order = reducer.ordered()
    if reducer.packing == "group":  # nodes that only produce a constant are the least likely culprits
        order.sort(key=lambda i: not reducer.index.node_inputs[i])
    singles = [_region(reducer, i) for i in order]  # a quantized op with its Q/DQ units
    saved = reducer.journal.get("layerwise")
    by_cost = reducer.packing == "numeric" and reducer.build_cost is not None
    if layerwise and saved is None and not by_cost:
        reducer.want_layerwise = True
    candidates = singles
    if reducer.packing == "numeric" and reducer.heavy():
        # Weights too big for one pack: the marked run first (a call of its own), then the nodes
        # alone nearest the anchor first, in as many packs as it takes to meet the first hit.
        reducer.verdicts([])
        if layerwise:
            _anchors(reducer, saved)
        anchor = reducer.anchors[0] if reducer.anchors else order[-1]
        order.sort(key=lambda i: (abs(i - anchor), i))
        candidates = [_region(reducer, i) for i in order]
        hit = reducer.first_interesting(candidates)
        reducer.isolated.update({i: o for i in order if (o := reducer.cached(_region(reducer, i))) is not None})
        return _accept(reducer, candidates, hit)
    if by_cost:
        # Packed by build cost (--pack-by build-cost): the singles in chunks that stop at the first
        # hit, where a value the target cannot hold is born first (_by_cost), no pair riding, and
        # the marked copy (as big as the model) not built here: where no single answers, the
        # pairs step asks the pairs first, and only a step after it needs the anchors (anchor_now)
        hit = _by_cost(reducer, order, singles)
        if saved is None:
            return _accept(reducer, candidates, hit)
    elif reducer.packing == "numeric":
        # every producer→consumer pair rides in the same call while the pack limits allow: when no
        # node shows the signature alone, the pairs step then costs no call (issue 25: ≤ 4 calls)
        ride_pairs(reducer)
        # Where the memory bound splits the survey, the packs follow the graph's order: a pack
        # that holds a node showing the signature alone holds the earliest such node, and the
        # packs after it are not run (the marked run, in the first pack, is then not needed).
        outcomes = reducer.verdicts(singles, stop_at_hit=True)
        reducer.isolated.update({i: o for i, o in zip(order, outcomes) if o is not None})
        hit = next((k for k, o in enumerate(outcomes) if o is not None and o.interesting), None)
        if hit is not None:
            reducer.want_layerwise = False
    else:
        # The singles together hold every node of the confirmed model: their group needs no
        # call of its own (binary splitting starts at its halves).
        # No producer→consumer pairs here: a pair that fails only with its edge intact is found by
        # the conflict search (a prefix window, then the node with its producers) in fewer calls
        # than a group test over every edge, which also re-derives what the singles already said.
        hit = reducer.first_interesting(singles, together_fail=len(order) == len(reducer.index.node_outputs))
        if layerwise:  # a numeric signature judged one by one (--one-by-one): the attribution's own errors
            reducer.isolated.update({i: o for i in order if (o := reducer.cached(_region(reducer, i))) is not None})
    if layerwise:
        _anchors(reducer, saved)
    if hit is None and reducer.interactions:
        together = min(reducer.interactions, key=len)
        if reducer.smaller(together):
            reducer.accept(together, "nodes that fail only together (group testing)")
        return False  # a union that fails alone, not a minimal one: the conflict search goes on from it
    return _accept(reducer, candidates, hit)


def _by_cost(reducer, order: list[int], singles: list[frozenset]) -> int | None:
    """The singles packed by build cost; the position of the one accepted, or None. First the
    nodes where a value the target's storage cannot hold is born (:func:`born_here`: an overflow,
    a flush to zero, read from the reference's own values, no call): they are where a NaN/Inf or
    a mismatch most often starts, and on every bundled sample and planted case one of them is the
    answer — asked first, the hit costs a chunk of a few nodes, not half the model. Then the rest
    in graph order. A NaN/Inf that none of those births shows alone is no single node's: the rest
    is not asked (every node alone costs as much as the model), the marked copy's anchor leads
    localize (the path from the birth to where the NaN/Inf shows) and ddmin proves the result
    1-minimal. Within each group the earliest hit in graph order wins, as packing by count takes it."""
    born = [k for k, i in enumerate(order) if born_here(reducer, i)]
    first = set(born)
    hit = None
    for group in (born, [k for k in range(len(order)) if k not in first]):
        if not group:
            continue
        outcomes = reducer.verdicts([singles[k] for k in group], stop_at_hit=True)
        reducer.isolated.update({order[k]: o for k, o in zip(group, outcomes) if o is not None})
        hit = next((k for k, o in zip(group, outcomes) if o is not None and o.interesting), None)
        if hit is not None or (group is born and reducer.signature.kind is Kind.NONFINITE):
            break
    return hit


def born_here(reducer, i: int) -> bool:
    """Does node ``i`` make a value the target's storage type cannot hold (beyond its maximum, or
    mass flush to zero: values.unrepresentable) from inputs it can hold? Read from the captured
    reference activations (cached per tensor by the reducer); False where the target has no narrow
    storage type or an index-free reducer has no values."""
    index = reducer.index
    if not hasattr(index, "node_outputs") or getattr(reducer, "store", None) is None:
        return False

    def cannot_hold(names) -> bool:
        return any(reducer.unrepresentable_feed({name: None}) for name in names if name)

    return cannot_hold(index.node_outputs[i]) and not cannot_hold(index.node_inputs[i])


def anchor_now(reducer) -> None:
    """Packed by build cost, the marked copy (a copy of the whole model, every tensor marked) is
    built when a step first needs the anchors and origins — localize, the drift window, the
    attribution — not in the survey: where a pair answers (PP-OCRv4 rec under emulate:bf16: the
    11th pair likeliest first) no step needs it. A call of its own; none where it ran already
    (packed by count, heavy, or before a --resume)."""
    if reducer.build_cost is None or reducer.packing != "numeric" or reducer.journal.get("layerwise") is not None:
        return
    reducer.begin("survey")  # its nodes are the survey's (summary.json's build_work.by_kind)
    reducer.want_layerwise = True
    reducer.verdicts([])
    _anchors(reducer, None)


def complete(reducer) -> bool:
    """Did the survey judge every node of the best alone (not stopped at a hit or at the births)?"""
    return all(i in reducer.isolated for i in reducer.best)


def pairs(reducer, *, known_only: bool = False) -> bool:
    """Every producer→consumer pair alone (fusions of two neighbours intact); True when one
    reproduces. ``known_only``: only the pairs already judged (they rode in an earlier call);
    no call. Any pair that reproduces is 1-minimal (its nodes were judged alone), so the first
    known one is as good as the first in order."""
    candidates = likeliest_first(reducer, matchings(reducer, reducer.ordered()))
    if reducer.build_cost is not None:  # each pair is a build: none that is a single judged already
        kept = [c for c in candidates if not consumer_alone(reducer, c)]
        reducer.exact_pairs = len(candidates) - len(kept)
        candidates = kept
    if known_only:
        known = [reducer.cached(c) for c in candidates]
        hit = next((k for k, o in enumerate(known) if o is not None and o.interesting), None)
        return _accept(reducer, candidates, hit)
    return _accept(reducer, candidates, reducer.first_interesting(candidates) if candidates else None)


# Below this bar float32 rounding alone could matter (see :func:`consumer_alone`).
EXACT_RULE_FROM = 1e-4


def exact_alone(reducer, i: int) -> bool:
    """Did node ``i`` compute the reference's values exactly alone in the survey (kind agree,
    error 0)? An engine that runs it in fp32 does: OpenVINO's CPU plugin under bf16 runs the
    elementwise nodes so (290 of PP-OCRv4 rec's 403 nodes)."""
    return _agreed_within(reducer, i, 0.0)


# An error alone no narrow type makes: fp16 rounds at 2^-11 (4.9e-4), bf16 at 2^-8, fp8 coarser;
# float32 arithmetic (x/6 computed as x*(1/6)) stays under 1e-7.
FP32_ROUNDING = 1e-6


def rounds_nothing_alone(reducer, i: int) -> bool:
    """Did node ``i`` alone stay within float32 rounding of the reference (kind agree, error at
    most ``FP32_ROUNDING``): did the engine run it in fp32? (352 of PP-OCRv4 rec's 403 nodes
    under openvino:bf16.)"""
    return _agreed_within(reducer, i, FP32_ROUNDING)


def _agreed_within(reducer, i: int, limit: float) -> bool:
    """Node ``i``'s survey outcome alone: it agreed, with an error of at most ``limit``."""
    outcome = reducer.isolated.get(i)
    return outcome is not None and outcome.kind == "agree" and outcome.error is not None and \
        float(outcome.error) <= limit


def consumer_alone(reducer, pair: frozenset) -> bool:
    """Is this producer→consumer pair, judged alone, its consumer alone (judged in the survey)?
    Where the producer computed the reference's values exactly alone (:func:`exact_alone`): fed
    the same reference values in the pair it computes them again, the consumer reads what it
    read alone, and the pair's outputs are the consumer's plus reference values (which the
    causal test injects as they are). Measured on PP-OCRv4 rec under openvino:bf16: each of the
    340 such pairs came within 1e-7 (rel-L2) of its consumer alone — the float32 rounding of a
    fused kernel, so the rule holds for bars from ``EXACT_RULE_FROM`` on. Pairs only: in a longer
    window the engine may round an exact node's output where a narrow node reads it inside
    (a 12-node window there drifted at 0.0101, its 9 nodes after such a head at 0.0098)."""
    bar = reducer.severity or getattr(reducer.oracle.criterion, "tolerance", None)
    if len(pair) != 2 or not bar or bar != bar or bar < EXACT_RULE_FROM:
        return False
    first, second = sorted(pair)  # the index order is topological: the producer comes first
    return exact_alone(reducer, first) and second in reducer.isolated


def ride_pairs(reducer) -> None:
    """The pairs not judged yet ride in the next packed call while it has room, likeliest first:
    where the room runs out, the pairs left are the least likely to reproduce. Packed by build
    cost, none rides: the pairs step asks them itself, in chunks that stop at the first hit."""
    if reducer.build_cost is not None:
        return
    reducer.ride_if_free(likeliest_first(reducer, matchings(reducer, reducer.ordered())))


def likeliest_first(reducer, candidates: list[frozenset]) -> list[frozenset]:
    """Numeric oracles: the pairs whose two nodes erred most alone first (the sum of the survey's
    isolated errors; a NaN counts as the largest, a node not judged alone as none); ties keep
    their order. What a pack's room holds depends on it, not the answer's quality: every pair
    that reproduces is 1-minimal. Pass/fail packs keep the matchings' order (group testing needs
    its runs of node-disjoint pairs)."""
    if reducer.packing != "numeric":
        return candidates

    def erred(i: int) -> float:
        outcome = reducer.isolated.get(i)
        error = None if outcome is None else outcome.error
        if error is None:
            return 0.0
        error = float(error)
        return math.inf if error != error else error

    return sorted(candidates, key=lambda pair: -sum(erred(i) for i in pair))


def _accept(reducer, candidates, hit) -> bool:
    if hit is None:
        return False
    if not reducer.smaller(candidates[hit]):
        return True  # the best is that pair already (a two-node model): nothing to accept
    what = "one node" if len(candidates[hit]) == 1 else "a producer→consumer pair"
    reducer.accept(candidates[hit], f"{what} that diverges alone (isolated survey)")
    return True


def matchings(reducer, order: list[int]) -> list[frozenset]:
    """Every producer→consumer edge inside the best as a pair, ordered as a sequence of
    matchings (greedy: each pair joins the first matching where both nodes are free), so a run
    of consecutive pairs is node-disjoint, as group testing needs."""
    kept = set(order)
    groups: list[tuple[set[int], list[frozenset]]] = []
    seen: set[frozenset] = set()
    for consumer in order:
        for tensor in reducer.index.node_inputs[consumer]:
            producer = reducer.index.producer.get(tensor)
            if producer is None or producer not in kept or producer == consumer:
                continue
            pair = frozenset((producer, consumer))
            if pair in seen:
                continue
            seen.add(pair)
            for used, members in groups:
                if producer not in used and consumer not in used:
                    used.update(pair)
                    members.append(pair)
                    break
            else:
                groups.append((set(pair), [pair]))
    return [pair for _, members in groups for pair in sorted(members, key=sorted)]


def _anchors(reducer, saved) -> None:
    """Anchors (where the signature's kind first shows while the node's inputs do not) and
    origins (first diverging tensors of any kind) from the marked run, journaled for resume;
    nodes that diverge on their own in the isolated survey are origins too."""
    if saved is not None:
        anchors, origins = saved["anchors"], saved.get("origins", [])
    else:
        anchors, origins = [], []
        report = reducer.layerwise_report
        if report is not None and report.rows:
            producer = reducer.index.producer
            status = {r.tensor: row_kind(r) for r in report.rows}
            wanted = reducer.signature.kind.value
            for row in report.rows:
                node = producer[row.tensor]
                if status[row.tensor] == wanted and not any(
                        status.get(i) == wanted for i in reducer.index.node_inputs[node]):
                    anchors.append(node)
            origins = sorted(dict.fromkeys(producer[r.tensor] for r in report.first))
            if not anchors:
                anchors = list(origins)
            anchors = sorted(dict.fromkeys(anchors))
        reducer.journal.put("layerwise", {"anchors": anchors, "origins": origins})
    own = [i for i, o in sorted(reducer.isolated.items()) if o.kind not in ("agree", "invalid", "no-outputs")]
    reducer.anchors = anchors
    reducer.origins = sorted(set(origins) | set(own))


def row_kind(row) -> str:
    """The verdict kind one tensor shows on its own: nonfinite, mismatch or agree."""
    if row.error.nonfinite_in_target_only:
        return Kind.NONFINITE.value
    return Kind.MISMATCH.value if row.error.exceeds else Kind.AGREE.value
