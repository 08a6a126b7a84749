"""The reduction core with a FAKE predicate: pure algorithm tests of the passes (ddmin, window,
branches, localize) and of the Reducer's cache and speculative parallel evaluation.

No engine runs here. ``FakePredicateReducer`` is the real ``Reducer`` with only the engine call
replaced by a Python predicate over node-index sets; the journal, the counting, ``prefetch``,
``first_interesting`` and ``accept`` are the real ones. Where a pass reads graph structure
(branches, localize) the GraphIndex comes from a real tiny model.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import shrink_models as sm
from hypothesis import given, settings
from hypothesis import strategies as st

from reprokit.engine.oracle import Kind, Signature
from reprokit.graph.index import GraphIndex
from reprokit.shrink.passes import branches, conflict, ddmin, localize, window
from reprokit.shrink.reducer import Journal, Outcome, Reducer


class FakePredicateReducer(Reducer):
    """A Reducer whose "engine" is a FAKE predicate on frozensets of node indices."""

    def __init__(self, predicate, n_nodes: int, *, index=None, jobs: int = 1, delay: float = 0.0):
        super().__init__(
            model=None,
            index=index,
            store=None,
            feeds={},
            oracle=None,
            signature=Signature(Kind.MISMATCH),
            workdir="",
            journal=Journal(None),
            jobs=jobs,
            best=frozenset(range(n_nodes)),
        )
        self.predicate = predicate
        self.delay = delay
        self.asked: Counter = Counter()  # candidate -> times the fake engine ran on it
        self.accepted: list[frozenset] = []
        self.on_accept = lambda reducer, step: self.accepted.append(reducer.best)
        self._ask_lock = threading.Lock()

    def _evaluate(self, nodes: frozenset) -> Outcome:
        # Same cache protocol as Reducer._evaluate; the engine call is the fake predicate.
        key = self.key(nodes)
        saved = self.journal.get(key)
        if saved is not None:
            return Outcome(
                saved["interesting"], saved["kind"], saved["detail"], saved["error"], True
            )
        if not nodes:
            return Outcome(False, "empty", "", None, True)
        with self._ask_lock:
            self.asked[nodes] += 1
        time.sleep(self.delay)
        interesting = bool(self.predicate(nodes))
        kind = "mismatch" if interesting else "agree"
        self.journal.put(
            key,
            {
                "interesting": interesting,
                "kind": kind,
                "detail": "",
                "error": None,
                "nodes": len(nodes),
            },
        )
        return Outcome(interesting, kind, "", None)


def run_pass(pass_module, predicate, n, **kwargs) -> FakePredicateReducer:
    reducer = FakePredicateReducer(predicate, n, **kwargs)
    try:
        reducer.begin(pass_module.__name__.rsplit(".", 1)[-1])
        pass_module.run(reducer)
    finally:
        reducer.close()
    return reducer


def contains(required):
    required = frozenset(required)
    return lambda nodes: required <= nodes


# -- ddmin ----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 64), data=st.data())
def test_ddmin_finds_exactly_the_required_pair(n, data):
    pair = data.draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=2))
    reducer = run_pass(ddmin, contains(pair), n)
    assert reducer.best == frozenset(pair)
    assert reducer.one_minimal is True
    assert max(reducer.asked.values()) == 1  # the cache: no candidate is asked twice


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 64), data=st.data())
def test_ddmin_on_a_monotone_predicate_returns_its_minimal_set(n, data):
    required = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 5)))
    reducer = run_pass(ddmin, contains(required), n)
    assert reducer.best == frozenset(required)
    assert reducer.one_minimal is True
    sizes = [len(s) for s in reducer.accepted]
    assert all(a > b for a, b in zip(sizes, sizes[1:]))  # every accepted step is strictly smaller


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 40), salt=st.integers(0, 2**32), data=st.data())
def test_ddmin_result_is_1_minimal_for_any_predicate(n, salt, data):
    """Non-monotone: sets holding the anchor pass by a coin flip seeded from their contents."""
    anchor = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    full = frozenset(range(n))

    def fake(nodes):
        if nodes == full:
            return True
        return frozenset(anchor) <= nodes and hash((salt, tuple(sorted(nodes)))) % 3 != 0

    reducer = run_pass(ddmin, fake, n)
    best = reducer.best
    assert fake(best)
    assert reducer.one_minimal is True
    for node in best:
        assert not fake(best - {node}), f"removing {node} still passes: not 1-minimal"


def test_ddmin_is_the_same_for_jobs_1_and_jobs_4():
    required = {3, 17, 18, 40}
    one = run_pass(ddmin, contains(required), 48)
    four = run_pass(ddmin, contains(required), 48, jobs=4)
    assert four.best == one.best == frozenset(required)
    assert four.accepted == one.accepted


# -- window ---------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(n=st.integers(3, 100), data=st.data())
def test_window_finds_the_contiguous_interval_around_what_is_needed(n, data):
    needed = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=4))
    reducer = run_pass(window, contains(needed), n)
    lo, hi = min(needed), max(needed)
    assert reducer.best == frozenset(range(lo, hi + 1))
    assert sum(reducer.asked.values()) <= 2 * math.ceil(math.log2(n)) + 1


def test_window_same_result_with_jobs_2():
    one = run_pass(window, contains({20, 44}), 64)
    two = run_pass(window, contains({20, 44}), 64, jobs=2)
    assert one.best == two.best == frozenset(range(20, 45))
    assert one.accepted == two.accepted


def test_parallel_window_never_evaluates_one_candidate_twice():
    """Found by this test: window prefetches [order[:mid], order[:(lo+mid)//2]], one candidate
    twice when hi == lo + 1, and prefetch did not deduplicate (fixed in 2e2d54f)."""
    # needing nodes 20 and 31 of 64: the end bisection reaches lo=31, hi=32 and prefetches
    # order[:31] twice; the start bisection does the same with order[11:]
    reducer = run_pass(window, contains({20, 31}), 64, jobs=2, delay=0.05)
    assert reducer.best == frozenset(range(20, 32))
    twice = {tuple(sorted(c)): k for c, k in reducer.asked.items() if k > 1}
    assert not twice


# -- branches and localize, on real graph structure -----------------------------------------


def test_branches_keeps_the_one_cone_that_reproduces():
    model = sm.branch_fault()
    index = GraphIndex.build(model)
    names = [n.name for n in model.graph.node]
    fault = names.index("b/mm")
    reducer = run_pass(branches, lambda nodes: fault in nodes, len(names), index=index)
    assert sorted(names[i] for i in reducer.best) == ["b/mm", "b/out", "b/scale", "b/softmax"]
    assert sum(reducer.asked.values()) <= 2  # one call per sink at most


def test_branches_does_nothing_when_no_single_cone_reproduces():
    model = sm.branch_fault()
    index = GraphIndex.build(model)
    names = [n.name for n in model.graph.node]
    needed = {names.index("b/mm"), names.index("a/relu")}
    reducer = run_pass(branches, contains(needed), len(names), index=index)
    assert reducer.best == frozenset(range(len(names)))
    assert reducer.accepted == []


def test_localize_grows_backwards_from_the_anchor_by_doubling():
    model = sm.pair_chain(length=32, first=4, second=27)
    index = GraphIndex.build(model)
    reducer = FakePredicateReducer(contains({21, 27}), 32, index=index)
    reducer.anchors = [27]
    reducer.begin("localize")
    assert localize.run(reducer) is True
    # one by one, smallest rung first: widths 1, 2 and 4 fail; 8 (nodes 20..27) is the first
    # to hold node 21
    assert reducer.best == frozenset(range(20, 28))
    assert sum(reducer.asked.values()) == 4
    reducer.begin("ddmin")
    ddmin.run(reducer)
    assert reducer.best == frozenset({21, 27})


def test_localize_gives_up_when_the_anchor_cone_does_not_reproduce():
    model = sm.pair_chain(length=32, first=4, second=27)
    index = GraphIndex.build(model)
    reducer = FakePredicateReducer(contains({27, 30}), 32, index=index)
    reducer.anchors = [27]
    reducer.begin("localize")
    assert localize.run(reducer) is False
    assert reducer.best == frozenset(range(32))


class FakePackReducer(FakePredicateReducer):
    """The real Reducer's packed and group-tested evaluation, with the engine call replaced by
    the FAKE predicate: one "call" answers every candidate of a pack (numeric), or says whether
    any member of a disjoint group is interesting (pass/fail)."""

    def __init__(self, predicate, n_nodes: int, *, packing: str, **kwargs):
        super().__init__(predicate, n_nodes, **kwargs)
        self.packing = packing
        self.calls = 0

    def _evaluate(self, nodes):
        known = self.cached(nodes)
        if known is not None:
            return known
        self.calls += 1
        return super()._evaluate(nodes)

    def _evaluate_pack(self, candidates, *, stop_at_hit=False, speculative=None):
        self.calls += 1
        return [self.record(c, Outcome(bool(self.predicate(c)), "mismatch" if self.predicate(c) else "agree",
                                       "", None, packed=True)) for c in candidates]

    def group_fails(self, candidates):
        assert all(not (a & b) for i, a in enumerate(candidates) for b in candidates[i + 1:])
        self.calls += 1
        return any(self.predicate(c) for c in candidates)


def test_packed_localize_answers_the_whole_ladder_in_one_call():
    model = sm.pair_chain(length=32, first=4, second=27)
    reducer = FakePackReducer(contains({21, 27}), 32, index=GraphIndex.build(model), packing="numeric")
    reducer.anchors = [27]
    reducer.begin("localize")
    assert localize.run(reducer) is True
    assert reducer.best == frozenset(range(20, 28))
    assert reducer.calls == 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 64), data=st.data())
def test_packed_ddmin_gives_the_one_by_one_result_in_a_call_per_deletion(n, data):
    required = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    alone = run_pass(ddmin, contains(required), n)
    packed = FakePackReducer(contains(required), n, packing="numeric")
    packed.begin("ddmin")
    ddmin.run(packed)
    assert packed.best == alone.best == frozenset(required)
    assert packed.one_minimal
    # one call per accepted deletion, plus the sweep that proves 1-minimality
    assert packed.calls <= len(packed.accepted) + 1


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 200), data=st.data())
def test_group_testing_finds_the_earliest_failing_single_in_about_log2_calls(n, data):
    """Pass/fail: one failing member among n disjoint singles costs about log2(n) + 1 calls,
    never n, and the answer is the one a one-by-one scan gives."""
    bad = data.draw(st.sets(st.integers(0, n - 1), min_size=0, max_size=2))
    reducer = FakePackReducer(lambda nodes: bool(nodes & bad), n, packing="group")
    singles = [frozenset([i]) for i in range(n)]
    hit = reducer.first_interesting(singles)
    assert hit == (min(bad) if bad else None)
    assert reducer.calls <= math.ceil(math.log2(n)) + 2


# -- conflict-set search (QuickXplain) -------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(n=st.integers(3, 300), data=st.data())
def test_conflict_search_finds_the_interacting_nodes_in_k_log_n_calls(n, data):
    """k nodes that fail only together, none alone: exactly those k, in at most
    2k·⌈log2(n/k)⌉ + 2k candidates judged (the bound of Junker's QuickXplain), plus the one
    that verifies the result alone — that one included where k ≤ √n; a pair in at most
    2⌈log2 n⌉ + 2 (a bisection for each node, one "does the pair fail alone" question; no graph
    here, so no fusion guess)."""
    required = data.draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=4))
    reducer = run_pass(conflict, contains(required), n)
    k = len(required)
    assert reducer.best == frozenset(required)
    assert len(reducer.asked) <= 2 * k * math.ceil(math.log2(max(2, n / k))) + 2 * k + 1
    if k * k <= n:
        assert len(reducer.asked) <= 2 * k * math.ceil(math.log2(n / k)) + 2 * k
    if k == 2:
        assert len(reducer.asked) <= 2 * math.ceil(math.log2(n)) + 2

