"""Pass/fail packs: one call judges a group of disjoint candidates (``group_fails``, used by the
Reducer's binary splitting in ``grouped.py``), and one calibration call decides whether a
check judges every member of a pack at all (a check that reads only the first output does not:
it is then given one candidate per call). The calibration is made when a pack first passes — a
pass is what clears members, a failing pack clears nothing — and holds the smallest model known
to fail then (issue 39): a run whose packs all fail never builds it. Builds its packs here,
beside the evaluator's."""

from __future__ import annotations

import os
import time

from reprokit.engine.bug import judge, shows_bug
from reprokit.engine.messages import quote_message
from reprokit.engine.worker import WorkerResult
from reprokit.graph.extract import Extraction
from reprokit.graph.pack import build_pack
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.confirm import PROBE_FEEDS, probe_model
from reprokit.shrink.evaluator import Outcome, prepare_candidate
from reprokit.shrink.journal import PassStats
from reprokit.shrink.references import save_candidate

# summary.json no_slippage.packs of a group-tested run whose calibration never came
NO_PACK_PASSED = ("packed, no calibration call: no pack passed, so none cleared a member (a passing pack "
                  "is trusted only once a calibration pack showed that the check judges a member after another)")


class Calibration:
    """A pass/fail check's pending pack calibration: ``make(failing)`` runs it, ``failing`` the
    members of the smallest pack seen failing so far (None: none), which it may hold instead of
    the best — any model seen failing answers the calibration's question, and a half of the
    model builds half the nodes of the original."""

    def __init__(self, make):
        self.make, self.failing, self.nodes = make, None, 0

    def saw_failing(self, members: list, nodes: int) -> None:
        if self.failing is None or nodes < self.nodes:
            self.failing, self.nodes = members, nodes

    def __call__(self) -> None:
        self.make(self)


def group_fails(reducer, group: list[frozenset]) -> bool:
    """Pass/fail: does a pack of these disjoint candidates show the signature? One call.
    A pack that passes clears every member: journaled as inferred from the group, not observed.
    The first pack that passes is trusted only after the check's calibration (``reducer.calibration``,
    one call); where it turns packs off, the members are judged one by one."""
    if reducer.packing != "group":
        return any(reducer.test(cand) for cand in group)
    prepared = []
    for cand in group:
        sub, trivial = prepare_candidate(reducer, cand, check=False)
        if trivial is None:
            prepared.append((cand, sub))
    if not prepared:
        return False
    with reducer.tally.timing("pack"):
        pack = build_pack([sub for _, sub in prepared], keep_node_names=True)
    reducer.charge()
    path = save_candidate(reducer, pack.model)
    start = time.monotonic()
    try:
        verdict = reducer.oracle.judge(path, pack.feeds, reference_outputs={})
    finally:
        os.remove(path)
    if not verdict.cached:
        reducer.note_call(pack.nodes, len(prepared), time.monotonic() - start, heavy_built=heavy_layers(pack.model))
    fails = shows_bug(reducer.signature, verdict)
    if reducer.calibration is not None and fails:
        reducer.calibration.saw_failing([sub for _, sub in prepared], pack.nodes)
    elif reducer.calibration is not None:  # a pass clears its members: only where packs are judged whole
        calibrate_first(reducer)
        if reducer.packing != "group":
            return any(reducer.test(cand) for cand in group)
    if not fails and not verdict.diverges:
        for cand, _ in prepared:
            reducer.record(cand, Outcome(False, "agree", "cleared in a group", None, packed=True, inferred=True))
    return fails


def calibrate_first(reducer) -> None:
    """The pending calibration, made now, when the run's first pack passed (a run whose packs
    all fail never calibrates: issue 39's fixed calls); the step that asked goes on after it."""
    pending, reducer.calibration = reducer.calibration, None
    step, calls = reducer.step, reducer.oracle.stats.target
    try:
        pending()
    finally:
        reducer.begin(step)
        # made during the passes: counted as theirs, as the calls held for them are released
        # (Reducer.held) — the budget is a promise
        reducer.spent += reducer.oracle.stats.target - calls


def calibrate_packs(reducer, event, ran: tuple | None = None, pending: Calibration | None = None,
                    decide=None) -> None:
    """A user's check may judge only part of a pack: one calibration call decides whether this
    run packs candidates at all; the summary says which and why. ``pending``: what the run saw
    failing before (the calibration's member, where smaller than the best). ``ran``: that call
    made already, before the confirmation (precalibrate.py): (why, nodes built, seconds, the
    pack's verdict as a whole), no call here. For group testing a known failing model passing
    inside the pack is a check that reads part of a pack or one that fails at random: one call on
    the original alone (``decide``, a replay: steps.py) tells them apart — passing, the target
    is flaky on the unchanged model (exit 6, confirm.RideAlong.check); failing, packs go off and
    the result earns two more runs before "done" (steps.shrink), as after a contradiction (a coin
    gives this F, P, F one run in 8)."""
    reducer.begin("calibrate")  # its own step: wall seconds from the run's clock
    failing = pending.failing if pending is not None else None
    why, built, seconds, _, heavy = ran or calibrate(reducer, Extraction(probe_model(reducer.model), dict(PROBE_FEEDS), ["y"]),
                                              failing)
    reducer.stats["calibrate"] = PassStats(calls=1, candidates=2, seconds=seconds)
    reducer.stats["calibrate"].note_built(built, heavy)
    if why is None:
        reducer.no_slippage["packs"] = "packed: the check failed a pack with a failing model after a passing one"
        return
    if reducer.packing == "group":
        if decide is not None:
            decide()
        reducer.contradictions += 1
    reducer.packing = None
    reducer.no_slippage["packs"] = f"one candidate per call: {why}"
    event(f"packs: one candidate per call ({why})")


def result_replays(reducer, replays: int, probed: bool = False) -> int:
    """Fresh runs a pass/fail check command's result gets after its first (final.py), the
    original's replays moved to it (issue 39). One of them is spared where the run saw another
    run that a coin gets wrong half the time: the calibration pack failing alike (or, after it
    passed, the original alone failing again), or the Identity probe not failing (``probed``:
    it runs only where no call passed, and a check failing whatever the model fails it). So a
    check failing with probability p whatever the model reaches "done" only after the original
    failed and three more such runs went its way — at most p^4 (p^6 after a contradiction).
    Measured on bench_passfail.py's flaky check, 40 runs each: exit 0 in 1 run (this rule),
    2 (never a third run of the result), 3 (a third run wherever no calibration came) and
    3 (the original's replay, before issue 39) — noise of that order; the bound decides."""
    # the calibration pack failed alike, or passed and the original alone failed again after it
    calibrated = ("calibrate" in reducer.stats and reducer.packing == "group") or "replay" in reducer.stats
    return max(0, replays - bool(calibrated or probed))


def calibrate(reducer, probe, failing: list | None = None) -> tuple[str | None, int, float, object, int]:
    """Is a pack judged as a whole by this check? One call: the known failing best placed after
    ``probe`` (an Extraction the check passes) — for group testing, the members of ``failing``
    (a pack seen failing) instead where they are fewer nodes. A check that reads only the first
    output, or only some of the outputs, passes that pack: group testing would then clear the
    culprit with its pack. Returns (None when packs are sound, else why not; nodes built;
    seconds; the group verdict, None for a numeric pack; heavy layers built)."""

    best = reducer.extraction(reducer.best)
    group = reducer.packing == "group"
    members = [best]
    if group and failing is not None and sum(len(m.model.graph.node) for m in failing) < len(best.model.graph.node):
        members = failing
    pack = build_pack([probe, *members], keep_node_names=group, same_node_names=reducer.names_select_nodes)
    path = save_candidate(reducer, pack.model)
    start = time.monotonic()
    try:
        if group:
            verdict = reducer.oracle.run_again(path, pack.feeds, {})
        else:
            result = reducer.oracle.run_target(path, pack.feeds)
    finally:
        os.remove(path)
    why = _calibration_verdict(reducer, best, pack, verdict if group else result)
    return why, pack.nodes, time.monotonic() - start, verdict if group else None, heavy_layers(pack.model)


def group_calibration(reducer, verdict) -> str | None:
    """A pass/fail check's calibration pack, judged as a whole: None when it failed alike."""
    if shows_bug(reducer.signature, verdict):
        return None
    return (f"a pack holding the failing model after a passing one gave "
            f"{verdict.signature.describe() if verdict.diverges else 'a pass'}: the check does not judge every member")


def refused_whole(result) -> str:
    """Why packs are off when the check failed on a calibration pack as a whole."""
    # its own words: a check that refuses a pack says why (a runner that feeds one input, an
    # opset its converter does not know), and the user can mend the check
    said = quote_message(result.message, 200)
    return (f"the check failed on a pack as a whole ({result.status}{': ' + said if said else ''}): "
            "it cannot judge members one by one")


def too_few_outputs(result, pack) -> str:
    """Why packs are off when the check wrote fewer outputs than the calibration pack has."""
    return (f"the check wrote {len(result.outputs)} of the pack's {sum(len(m.outputs) for m in pack.members)} "
            "outputs: it reads fewer outputs than a pack has")


def _calibration_verdict(reducer, best, pack, seen) -> str | None:
    if reducer.packing == "group":
        return group_calibration(reducer, seen)
    result = seen
    try:
        if result.status != "ok":
            return refused_whole(result)
        member = pack.members[1]
        outputs = {original: result.outputs[packed] for packed, original in member.outputs.items()
                   if packed in result.outputs}
        if set(outputs) != set(member.outputs.values()):
            return too_few_outputs(result, pack)
        reference = {n: reducer.store.get(n) for n in best.outputs if n in reducer.store}
        own = WorkerResult("ok", outputs=outputs, meta=result.meta, seconds=result.seconds)
        judged = judge(reducer.signature, reducer.oracle.verdict_from(own, reference), severity=reducer.severity)
        return None if judged.shows else f"the failing model, second in a pack, gave {judged.describe()}"
    finally:
        result.discard()
