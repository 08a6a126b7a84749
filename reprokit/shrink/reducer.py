"""The Reducer: one mutable current best (a set of node indices, and once the shapes pass ran, the
crop of its inputs), one cache of outcomes (the journal on disk, for resume, under one key:
``known.py``), the call budget and per-pass statistics (``ledger.py``), and what passes call to
have candidates judged.

"Smaller" is :meth:`Reducer.smaller`: fewer nodes, then (same nodes) fewer input elements. A pass
accepts a candidate only when it is smaller than the best and shows the ORIGINAL signature (no
slippage). Passes state the candidates they want judged in a fixed order and take the earliest
interesting one; how many candidates one engine call answers (alone, packed, group-tested) is
decided by the evaluation layer (``evaluator.py``), never by a pass, so results do not depend on
packing or on ``jobs``. Must not build packs or talk to the engine itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from reprokit.engine.oracle import Signature
from reprokit.engine.worker import kill_running
from reprokit.graph.extract import extract
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import weight_bytes
from reprokit.shrink import evaluator, grouped, passfail
from reprokit.shrink.evaluator import Outcome
from reprokit.shrink.journal import Journal, PassStats
from reprokit.shrink.known import KnownOutcomes
from reprokit.shrink.ledger import TRIVIAL, BudgetExhausted, CallLedger
from reprokit.shrink.space import CandidateSpace
from reprokit.shrink.tally import Tally
from reprokit.standalone.values import unrepresentable

__all__ = ["BudgetExhausted", "Journal", "Outcome", "PassStats", "Reducer", "TRIVIAL"]


@dataclass
class Reducer(KnownOutcomes, CallLedger):
    model: object
    index: GraphIndex
    store: object  # ActivationStore
    feeds: dict
    oracle: object
    signature: Signature
    workdir: str
    journal: Journal
    jobs: int = 1
    on_accept: Callable[[Reducer, str], None] | None = None
    on_event: Callable[[str], None] | None = None
    best: frozenset = frozenset()
    anchors: list = field(default_factory=list)  # node indices where the signature's kind starts
    origins: list = field(default_factory=list)  # first diverging nodes of any kind
    history: list = field(default_factory=list)  # accepted bests, oldest first
    required: frozenset = frozenset()  # nodes every candidate keeps (the fault's origin, once found)
    stats: dict[str, PassStats] = field(default_factory=dict)
    findings: dict[str, int] = field(default_factory=dict)  # other signatures seen, with counts
    one_minimal: bool = False
    budget: int | None = None  # engine calls the passes may still make; None = no limit
    stopped: bool = False  # the passes stopped at the budget
    spent: int = 0  # engine calls the passes made
    held: Callable[[], int] = lambda: 0  # calls the run may still owe outside the passes (a probe, a replay)
    before_accept: Callable[[], None] | None = None  # may refuse the run before a best is kept (the probe)
    cancelled: bool = False  # set on interrupt: outcomes of killed calls are not journaled
    packing: str | None = None  # None (one by one), "numeric" (packed) or "group" (group testing)
    # a check command's pack calibration, made before the first group pack (passfail.group_fails)
    calibration: Callable[[], None] | None = None
    pack_bytes: int = 1 << 30  # data (feeds, outputs, weights) one packed call may hold: budget.pack_memory
    pack_nodes: int = 4096  # nodes one packed call may build
    build_cost: object | None = None  # buildcost.BuildCost packs follow (--pack-by build-cost); None: by count
    isolated: dict = field(default_factory=dict)  # node index -> Outcome of the node alone
    exact_pairs: int = 0  # pairs not built: each is its consumer alone (survey.consumer_alone)
    severity: float | None = None  # a mismatch candidate's error must reach this (None: the tolerance)
    message_key: str = ""  # the original failure's normalized message (pass/fail oracles)
    allowance: Callable[[int], int] | None = None  # allowance(calls): extra budget a pass may claim (auto budget)
    hotspots: dict = field(default_factory=dict)
    crop_tries: dict = field(default_factory=dict)  # node set -> [ShapeTry] judged speculatively
    shapes: bool = False  # the run crops the result's inputs (shapes pass): crops may ride along early  # node set -> (output, index, shape) of its largest error
    interactions: list = field(default_factory=list)  # groups that fail only together (group testing)
    contradictions: int = 0  # groups that failed with no member failing alone (or a flaky check)
    want_layerwise: bool = False  # the next packed call also runs the marked whole model
    ride_along: object | None = None  # confirm.RideAlong: the original's replay, for the next packed call
    original_replay: str = ""  # how the original's replays ran (summary.json)
    confirmed: str = ""  # where the original's first judgement ran when not at confirm (summary.json)
    layerwise_report: object | None = None  # reprokit.engine.layerwise.LayerwiseReport, once run
    names_select_nodes: bool = False  # the target picks nodes by name (fp32-nodes=): packs keep them
    share_feeds: bool = False  # the target runs nodes as written: packed members share equal feeds (members.py)
    keep_inputs: bool = False  # --no-reduce-inputs: every candidate reads only the model's own inputs
    keep_outputs: bool = False  # --no-reduce-outputs: every candidate gives exactly the model's outputs
    reach_inside: bool = False  # the "inside" step may reduce the nodes inside kept If branches
    space: CandidateSpace = field(default_factory=CandidateSpace)  # how node ids become candidates (space.py)
    guard: Callable | None = None  # guard(step, run) runs the reference on a model reprokit built
    causal: object | None = None  # reprokit.engine.bug.CausalTest of a numeric signature, or None
    no_slippage: dict = field(default_factory=dict)  # which test held the signature, and why (summary)
    judged_by: dict = field(default_factory=dict)  # Decision value -> accepted candidates it decided
    clock: object | None = None  # reprokit.shrink.clock.StepClock: wall seconds per step
    tally: Tally = field(default_factory=Tally)  # seconds of extraction, packing, writing, comparing
    _current: str = "setup"

    def __post_init__(self):
        self._pool = ThreadPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None
        self._lock = threading.Lock()
        self._feed_ok: dict[str, str | None] = {}
        self._speculative: list[frozenset] = []
        self._speculative_members: list = []
        self._riders: list[tuple[frozenset, bool]] = []
        self._weights: int | None = None
        self._readers: dict | None = None

    def within(self, space: CandidateSpace, model, index: GraphIndex, store, feeds: dict, best: frozenset) -> Reducer:
        """A reducer over another candidate space (the inside step's sites) that holds what this
        one holds — the oracle, the signature and the whole decision (causal test, severity
        floor, message), packing, pack limits, the call reserve — with its own best, statistics,
        findings and budget (the caller sets it and adds what was spent back). Every field not
        named here is inherited: a new part of the decision reaches inner reducers by default."""
        return dataclasses.replace(
            self, model=model, index=index, store=store, feeds=feeds, best=best, space=space,
            on_accept=None, before_accept=None, anchors=[], origins=[], history=[], required=frozenset(),
            stats={}, findings={}, one_minimal=False, budget=None, stopped=False, spent=0, allowance=None,
            isolated={}, hotspots={}, crop_tries={}, shapes=False, interactions=[], contradictions=0,
            want_layerwise=False, ride_along=None, original_replay="", confirmed="", layerwise_report=None,
            no_slippage={}, judged_by={}, clock=None, tally=Tally(), _current="setup", calibration=None,
            # packs not calibrated yet: the inner reducer judges one candidate per call
            packing=None if self.calibration is not None and self.packing == "group" else self.packing)

    # -- candidates -------------------------------------------------------------------------

    def smaller(self, nodes: Iterable[int], than: Iterable[int] | None = None) -> bool:
        """Is the candidate smaller than ``than`` (default: the current best)? Fewer nodes; a
        shape try of the same nodes is smaller with fewer input elements (``smaller_crop``)."""
        return len(frozenset(nodes)) < len(frozenset(self.best if than is None else than))

    @staticmethod
    def smaller_crop(elements: int, than: int) -> bool:
        """Same nodes: fewer input elements is smaller."""
        return elements < than

    def extraction(self, nodes, *, check: bool = True):
        with self.tally.timing("extraction"):
            if self.space.build is not None:
                return self.space.build(nodes, check)
            sub = extract(self.model, self.index, nodes, self.store, feeds=self.feeds, check=check)
            return self.space.wrap(sub) if self.space.wrap is not None and sub.outputs else sub

    def _evaluate(self, nodes: frozenset) -> Outcome:
        """One candidate alone: cache, or one engine call (the evaluation layer)."""
        known = self.cached(nodes)
        return known if known is not None else evaluator.judge_alone(self, nodes)

    def _evaluate_pack(self, candidates: list[frozenset], *, stop_at_hit: bool = False,
                       speculative: set | None = None) -> list[Outcome | None]:
        """Several candidates in as few engine calls as the pack limits allow."""
        return evaluator.judge_packed(self, candidates, stop_at_hit=stop_at_hit, speculative=speculative or set())

    def heavy(self) -> bool:
        """Are the model's weights more than half of what one pack may hold? (A copy of the whole
        model beside others would then hold every weight twice.)"""
        if self._weights is None:
            self._weights = weight_bytes(self.model)
        return self._weights > self.pack_bytes // 2

    def group_fails(self, candidates: list[frozenset]) -> bool:
        """Pass/fail: does one call on these disjoint candidates together show the signature?"""
        return passfail.group_fails(self, candidates)

    def unrepresentable_feed(self, feeds: dict) -> str | None:
        """A cut tensor the target's storage type cannot hold (fp16 overflow, mass underflow)
        would carry the fault in the data, not in the kept nodes: such candidates are invalid."""
        for name in feeds:
            if name in self.index.graph_inputs or name not in self.store:
                continue  # the user's own data (or a wrapper's condition) stays as it is
            if name not in self._feed_ok:
                self._feed_ok[name] = unrepresentable(self.store.get(name), self.oracle.precision)
            if self._feed_ok[name]:
                return f"cut tensor {name!r}: {self._feed_ok[name]}"
        return None

    # -- what passes call ---------------------------------------------------------------------

    def test(self, nodes) -> bool:
        """Is this node set interesting? Judged alone (or known)."""
        nodes = frozenset(nodes)
        return self.count(self._evaluate_checked(nodes)).interesting

    def verdicts(self, candidates: list, *, stop_at_hit: bool = False) -> list[Outcome | None]:
        """Outcomes of every candidate, in order (packed into few calls where the oracle allows).
        ``stop_at_hit``: packed calls stop after the first one that holds an interesting
        candidate; the candidates after it stay unjudged (None)."""
        candidates = [frozenset(c) for c in candidates]
        known = {c: self.cached(c) for c in candidates}
        todo = list(dict.fromkeys(c for c in candidates if known[c] is None))
        if (todo or self.want_layerwise) and self.packing == "numeric":
            extra = [c for c in dict.fromkeys(self._take_speculative()) if self.cached(c) is None and c not in todo]
            if self.build_cost is not None:  # a speculative candidate rides only where its build pays
                self._riders.extend((c, True) for c in extra)
                extra = []
            todo = todo + extra
            for cand, outcome in zip(todo, self._evaluate_pack(todo, stop_at_hit=stop_at_hit, speculative=set(extra))):
                known[cand] = outcome
        else:
            self.prefetch(todo)
            for cand in todo:
                known[cand] = self._evaluate_checked(cand)
        return [self.count(known[c]) if known[c] is not None else None for c in candidates]

    def first_interesting(self, candidates: list, *, together_fail: bool = False) -> int | None:
        """Index of the earliest interesting candidate in order, or None. ``together_fail``: the
        candidates together are known to fail (they cover the confirmed model), so group testing
        need not spend a call on all of them at once."""
        candidates = [frozenset(c) for c in candidates]
        if self.packing == "numeric":
            for start, chunk in self._chunks(candidates):
                settled = self._known_hit(chunk)
                if settled is not None:
                    return start + settled  # answered by calls already made: no pack for the rest
                for offset, outcome in enumerate(self.verdicts(chunk, stop_at_hit=True)):
                    if outcome is not None and outcome.interesting:
                        return start + offset
            return None
        if self.packing == "group":
            return grouped.first_failing_group(self, candidates, together_fail=together_fail)
        for start in range(len(candidates)):
            self.prefetch(candidates[start : start + self.jobs])
            if self.test(candidates[start]):
                return start
        return None

    def _known_hit(self, candidates: list[frozenset]) -> int | None:
        """The position of the first interesting candidate when every one before it is known
        (judged already, riders of an earlier call): the earliest in order without a call. The
        outcomes read are counted only then (else ``verdicts`` counts them with the rest)."""
        known = []
        for cand in candidates:
            outcome = self.cached(cand)
            if outcome is None:
                return None
            known.append(outcome)
            if outcome.interesting:
                for seen in known:
                    self.count(seen)
                return len(known) - 1
        return None

    def also_judge(self, candidates: list) -> None:
        """Candidates a later step will probably ask about: they ride along in the next packed
        call (numeric oracles only), so that step finds them cached."""
        if self.packing == "numeric":
            self._speculative.extend(frozenset(c) for c in candidates)

    def also_judge_members(self, members: list) -> None:
        """Members with their own reference (shape crops of a likely next best) for the next
        packed call (numeric oracles only)."""
        if self.packing == "numeric":
            self._speculative_members.extend(members)

    def ride_if_free(self, candidates: list, *, quiet: bool = False) -> None:
        """Candidates a later step may ask about that join the next packed call only while it
        stays under the pack limits (numeric oracles only): never a call, never a pack, of their
        own. Those that did not fit are judged when asked, as any other. ``quiet``: a hit among
        them does not stop that call's packs (they answer a later step, not this one)."""
        if self.packing == "numeric":
            self._riders.extend((frozenset(c), quiet) for c in candidates)

    def take_riders(self) -> list[tuple[frozenset, bool]]:
        """The riders not judged yet, each with its ``quiet`` flag; the list is emptied."""
        taken, self._riders = self._riders, []
        return [(c, quiet) for c, quiet in taken if self.cached(c) is None]

    def take_speculative_members(self) -> list:
        taken, self._speculative_members = self._speculative_members, []
        return taken

    def _take_speculative(self) -> list[frozenset]:
        taken, self._speculative = self._speculative, []
        return taken

    def _chunks(self, candidates: list[frozenset]):
        """Consecutive slices of candidates that one pack can hold (by node count)."""
        start, size, nodes = 0, 0, 0
        for position, cand in enumerate(candidates):
            if size and nodes + len(cand) > self.pack_nodes:
                yield start, candidates[start:position]
                start, size, nodes = position, 0, 0
            size += 1
            nodes += len(cand)
        if size:
            yield start, candidates[start:]

    def _evaluate_checked(self, nodes: frozenset) -> Outcome:
        known = self.cached(nodes)
        if known is not None:
            return known
        self.charge()
        return self._evaluate(nodes)

    def prefetch(self, candidates: list) -> None:
        """Evaluate upcoming candidates in parallel so the sequential order finds them cached.
        With jobs == 1, packed evaluation or a call budget this does nothing: results never
        depend on the number of jobs, and the budget counts every call that runs."""
        if self._pool is None or self.packing == "numeric" or self.budget is not None:
            return
        todo = list(dict.fromkeys(frozenset(c) for c in candidates if c and self.cached(c) is None))
        for future in [self._pool.submit(self._evaluate, c) for c in todo[: self.jobs]]:
            future.result()

    # -- progress ---------------------------------------------------------------------------

    @property
    def step(self) -> str:
        return self._current

    def begin(self, name: str) -> None:
        self._current = name
        if self.clock is not None:  # summary.json's wall seconds per step (clock.py)
            self.clock.begin(name)
        self.stats.setdefault(name, PassStats())
        self.event(f"{name}: {len(self.best)} nodes")

    def accept(self, nodes, why: str = "") -> None:
        nodes = frozenset(nodes)
        if not self.smaller(nodes):
            raise ValueError(f"{self._current}: a candidate of {len(nodes)} nodes is not smaller than the best "
                             f"({len(self.best)})")
        if self.before_accept:
            self.before_accept()
        stats = self.stats.setdefault(self._current, PassStats())
        stats.removed += len(self.best) - len(nodes)
        stats.accepted += 1
        self._count_decision(nodes)
        self.best = nodes
        self.history.append(nodes)
        self.event(f"{self._current}: kept {len(nodes)} nodes{(' — ' + why) if why else ''}")
        if self.on_accept:
            self.on_accept(self, self._current)

    def event(self, text: str) -> None:
        if self.on_event:
            self.on_event(text)

    def ordered(self, nodes=None) -> list[int]:
        return sorted(self.best if nodes is None else nodes)

    def close(self, *, interrupted: bool = False) -> None:
        """Stop the pool. On an interrupt, kill the engine calls in flight first, so Ctrl-C
        does not wait for a long build, and keep their outcomes out of the journal."""
        if interrupted:
            self.cancelled = True
            kill_running()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=interrupted)
