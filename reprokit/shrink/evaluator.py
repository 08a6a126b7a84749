"""The evaluation layer: turn "verdicts for these candidates" into engine calls. The ONLY place
packs are built: node-set passes and the shapes pass alike ask here.

Three ways, chosen by the Reducer from the signature, never by a pass:

- **alone**: one candidate, one call (and the last word on any result);
- **packed** (numeric oracles: nonfinite, mismatch): many candidates as disjoint copies in one
  model (``graph/pack.py``), each judged from its own outputs against its own reference (the
  captured activations, or a shape try's own reference run), with the same oracle and signature
  rule. A pack the engine refuses as a whole is split in halves;
- **group-tested** (pass/fail oracles: exit status, build error, crash): a pack of candidates
  with disjoint node sets and the user's node names; a pack that passes clears every member in
  one call (journaled as *inferred*, not observed), a failing one is split (binary splitting),
  so one failing member among W costs about log2 W calls. When no member fails alone, the
  members interact: nothing is concluded.

Every candidate outcome is journaled on its own, under the Reducer's one key, so ``--resume``
replays packed work too. The binary-splitting search over group verdicts is ``grouped.py``. This module talks to the Reducer only through its public methods
(``cached``, ``record``, ``count``, ``test``, ``group_fails``, ``charge``, ``note_call``) and
never imports it: the Reducer imports this module. Group tests of pass/fail candidates and the
calibration of a check's packs are ``passfail.py``; reference runs of extractions and the element
of largest error are ``references.py``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from reprokit.engine.bug import Decision, judge, largest_error
from reprokit.engine.layerwise import compare_marked_run, float_node_outputs
from reprokit.engine.oracle import normalize_message
from reprokit.engine.worker import WorkerResult
from reprokit.graph.extract import Extraction, NotCaptured
from reprokit.graph.model import mark_outputs
from reprokit.graph.pack import build_pack
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.journal import PassStats
from reprokit.shrink.members import Member, built_by, fit, ride_along
from reprokit.shrink.references import hotspot, save_candidate


@dataclass
class Outcome:
    """What one candidate did: interesting means "shows the original signature"."""

    interesting: bool
    kind: str
    detail: str
    error: float | None
    from_cache: bool = False
    packed: bool = False  # judged inside a pack (never the last word on a result)
    inferred: bool = False  # concluded from a group's verdict, never run as itself
    decision: Decision | None = None  # engine/bug.py's decision (None: trivial, or inferred from a group)


# Progress inside one step (issue 28 item 8): packs this big say when they are built, run and
# compared, and a long extraction of candidates says how far it got every few seconds.
BIG_PACK = 256
SAY_EVERY = 3.0


def prepare_candidate(reducer, nodes: frozenset, *, check: bool):
    """The candidate's extraction, or a trivial outcome that needs no engine call."""
    try:
        sub = reducer.extraction(nodes, check=check)
    except NotCaptured as exc:
        return None, Outcome(False, "invalid", f"cuts at {exc.args[0]}, a value the reference capture has "
                                               "none of (a sequence or optional)", None, True)
    if not sub.outputs:
        return None, Outcome(False, "no-outputs", "", None, True)
    with reducer.tally.timing("extraction"):  # the cut tensors checked: part of making the candidate
        reason = reducer.unrepresentable_feed(sub.feeds)
    if reason:
        return None, Outcome(False, "invalid", reason, None, True)
    return sub, None


def causal_test(reducer):
    """The run's causal test, for every candidate space (space.py): top-level candidates, those
    put back inside an If, sites inside branches and the model the inside step adopted alike."""
    return reducer.causal


def causal_nodes(reducer, nodes):
    """The candidate's node ids as the causal test's cone test reads them, or None (by names)."""
    if nodes is None or reducer.causal is None:
        return None
    return reducer.space.causal_nodes(nodes, reducer.causal.model is reducer.model)


def _causal_for(reducer, member):
    """The causal test for this member: none for a shape try (it carries its own reference and
    has no full-size values to inject; the node-minimal model it crops passed the test)."""
    if member.reference is not None or member.crop or member.nodes is None:
        return None
    return causal_test(reducer)


def _outcome(reducer, verdict, *, packed: bool, member=None) -> Outcome:
    causal = _causal_for(reducer, member) if member is not None else None
    held = reducer.held_for(member.nodes) if member is not None and member.crop else reducer.signature
    judged = judge(held, verdict, severity=reducer.severity, causal=causal,
                   nodes=causal_nodes(reducer, member.nodes) if member is not None else None)
    error = largest_error(verdict)
    if judged.decision in (Decision.MILDER, Decision.NOT_CAUSAL):
        # A mismatch much milder than the original's is another, smaller effect: a repro a
        # maintainer would dismiss as noise; a value that never reaches the failing outputs is
        # a look-alike. Counted, never followed.
        label = (f"milder mismatch ({judged.why})" if judged.decision is Decision.MILDER
                 else "same signature, not the cause (causal test)")
        reducer.findings[label] = reducer.findings.get(label, 0) + 1
    if judged.shows and reducer.message_key and verdict.message:
        # Same failure class, other words (a check printing which node it saw): counted, so the
        # summary can say so and suggest --fail-regex when they are different bugs.
        said = normalize_message(verdict.message)
        if said and said != reducer.message_key:
            label = f"same {verdict.kind.value}, other message: {said}"
            reducer.findings[label] = reducer.findings.get(label, 0) + 1
    return Outcome(
        interesting=judged.shows,
        kind=verdict.kind.value, detail=verdict.signature.detail,
        error=error,
        from_cache=verdict.cached, packed=packed, decision=judged.decision,
    )


def judge_alone(reducer, nodes: frozenset) -> Outcome:
    """One candidate in one engine call (or the oracle's own cache)."""
    sub, trivial = prepare_candidate(reducer, nodes, check=True)
    if trivial is not None:
        return trivial
    return judge_member(reducer, Member(nodes, sub))[0]


def judge_member(reducer, member: Member):
    """One member alone, in one engine call: (its journaled Outcome, the Verdict)."""
    _confirm_first(reducer)
    sub = member.sub
    reducer.charge()
    path = save_candidate(reducer, sub.model)
    start = time.monotonic()
    try:
        verdict = reducer.oracle.judge(path, sub.feeds, reference_outputs=_reference(reducer, member),
                                       keep_outputs=_causal_for(reducer, member) is not None)
    finally:
        os.remove(path)
    if not verdict.cached:
        reducer.note_call(len(sub.model.graph.node), 1, time.monotonic() - start,
                          heavy_built=heavy_layers(sub.model))
    with reducer.tally.timing("compare"):
        outcome = _outcome(reducer, verdict, packed=False, member=member)
    return reducer.record(member.nodes, outcome, crop=member.crop), verdict


def _reference(reducer, member: Member) -> dict:
    if member.reference is not None:
        return member.reference
    return {name: reducer.store.get(name) for name in member.sub.outputs if name in reducer.store}


def judge_packed(reducer, candidates: list[frozenset], *, stop_at_hit: bool = False,
                 speculative: set = frozenset()) -> list[Outcome | None]:
    """Outcomes of numeric candidates, as many per engine call as the pack limits allow. A
    pending layerwise request (``reducer.want_layerwise``) rides along as one more member: the
    whole model with every float tensor marked, its own copy like any other member.
    ``speculative``: candidates a later step may ask about (``Reducer.also_judge``)."""
    results: dict[frozenset, Outcome] = {}
    members = []
    if reducer.want_layerwise:
        marked = _marked_member(reducer)
        if reducer.heavy():  # its own copy of every weight would double what the engine holds
            _run_marked_alone(reducer, marked)
        else:
            members.append(Member(None, marked))
    ride = reducer.ride_along
    if ride is not None:  # first, so the first pack carries it, whatever stops the packs later
        members.insert(0, Member(None, ride.sub, reference=ride.reference, replay=True))
    said = time.monotonic()
    for done, cand in enumerate(candidates):
        if len(candidates) >= BIG_PACK and time.monotonic() - said >= SAY_EVERY:  # extraction is slow on big models
            reducer.event(f"{reducer.step}: extracted {done} of {len(candidates)} candidates")
            said = time.monotonic()
        sub, trivial = prepare_candidate(reducer, cand, check=False)
        if trivial is not None:
            results[cand] = trivial
        else:
            members.append(Member(cand, sub, role="speculative" if cand in speculative else ""))
    # by build cost, a sequence that stops at its first hit is judged in chunks (buildcost.py)
    chunk = reducer.chunks(candidates) if stop_at_hit else None
    asked = set(candidates)
    speculative_members = reducer.take_speculative_members()
    riders = _rider_members(reducer, [(c, q) for c, q in reducer.take_riders() if c not in asked])
    with reducer.tally.timing("pack"):  # which members go in which pack: pack assembly too
        groups = fit(reducer, members, chunks=chunk)
        ride_along(reducer, groups, speculative_members, riders)
    for group in groups:
        _carry_pending_replay(reducer, group)
        found = _run_numeric_pack(reducer, group)
        results.update((m.nodes, outcome) for m, outcome in found.items() if m.nodes is not None and not m.crop)
        if stop_at_hit and any(outcome.interesting for m, outcome in found.items() if not m.quiet):
            break
    return [results.get(c) for c in candidates]


def _carry_pending_replay(reducer, group: list[Member]) -> None:
    """A replay the pack before this one made pending (a folded confirmation's) rides first in
    this one: a packed call carries it, not a call of its own."""
    pending = reducer.ride_along
    if pending is not None and not pending.folded and not any(m.replay for m in group):
        group.insert(0, Member(None, pending.sub, reference=pending.reference, replay=True))


def _rider_members(reducer, riders: list[tuple[frozenset, bool]]):
    """Members for ``Reducer.ride_if_free`` candidates (with their ``quiet`` flags), extracted
    only as far as the last pack takes them (a trivial one is recorded at once: it needs no call)."""
    for cand, quiet in riders:
        sub, trivial = prepare_candidate(reducer, cand, check=False)
        if trivial is not None:
            reducer.record(cand, trivial)
        else:
            yield Member(cand, sub, quiet=quiet, role="rider")


def judge_members(reducer, members: list[Member], *, stop_at_hit: bool = False) -> list[Outcome | None]:
    """Outcomes of members that carry their own reference (shape tries), in order. Numeric
    signatures: as few packed calls as the limits allow (``stop_at_hit`` and packed by build
    cost: in chunks, none after the first that holds one showing the signature). Pass/fail ones:
    alone, in order, until one shows the signature (the ones after it stay None)."""
    if reducer.packing == "numeric" and len(members) > 1:
        found: dict[int, Outcome] = {}
        chunk = reducer.chunks([m.nodes or () for m in members]) if stop_at_hit else None
        for group in fit(reducer, members, chunks=chunk):
            _carry_pending_replay(reducer, group)  # the shapes ladder carries the original's replay
            outcomes = _run_numeric_pack(reducer, group)
            found.update((id(m), o) for m, o in outcomes.items())
            if chunk is not None and any(o.interesting for o in outcomes.values()):
                break
        return [found.get(id(m)) for m in members]
    results: list[Outcome | None] = [None] * len(members)
    for position, member in enumerate(members):
        results[position] = judge_member(reducer, member)[0]
        if results[position].interesting:
            break
    return results


def _marked_member(reducer):
    names = [t for t, *_ in float_node_outputs(reducer.model)]
    outputs = list(dict.fromkeys([*reducer.index.graph_outputs, *names]))
    return Extraction(mark_outputs(reducer.model, names), dict(reducer.feeds), outputs)


def _layerwise_from(reducer, outputs: dict, status: str = "ok", message: str = "") -> None:
    reducer.want_layerwise = False
    reducer.layerwise_report = compare_marked_run(
        reducer.model, reducer.store, WorkerResult(status, outputs=outputs, message=message), reducer.oracle)


def _confirm_first(reducer) -> None:
    """A folded confirmation (confirm.FoldedConfirm) still pending when a call that cannot carry
    it comes: the original is judged alone first — nothing is judged before its signature is."""
    if getattr(reducer.ride_along, "folded", False):
        run_replay_alone(reducer)


def _run_marked_alone(reducer, sub) -> None:
    _confirm_first(reducer)
    reducer.charge()
    path = save_candidate(reducer, sub.model)
    start = time.monotonic()
    try:
        result = reducer.oracle.run_target(path, sub.feeds, sub.outputs)
    finally:
        os.remove(path)
    reducer.note_call(len(sub.model.graph.node), 0, time.monotonic() - start,
                      {"marked copy": len(sub.model.graph.node)}, heavy_built=heavy_layers(sub.model))
    try:
        _layerwise_from(reducer, dict(result.outputs) if result.status == "ok" else {}, result.status,
                        result.message)
    finally:
        result.discard()


def _replayed(reducer, result) -> None:
    """The original's replay came back: judged against the reference as confirm judges it; a
    verdict without the signature stops the run (a flaky original, confirm.RideAlong.check)."""
    ride, reducer.ride_along = reducer.ride_along, None
    if set(result.outputs) != set(ride.reference):  # a pack lost an output: no replay, run it alone
        reducer.ride_along = ride
        run_replay_alone(reducer)
        return
    ride.check(reducer.oracle.verdict_from(result, ride.reference))


def run_replay_alone(reducer, why: str = "") -> None:
    """The original's replay in a call of its own (no packed call carried it). Not charged to
    the passes' budget: the run reserves it where no pack carries it (steps.py)."""
    ride, reducer.ride_along = reducer.ride_along, None
    if ride is None:
        return
    reducer.event(f"judging the original alone ({why or 'no packed call carried it'})" if ride.folded else
                  "replaying the original (no packed call carried its replay)")
    path = save_candidate(reducer, ride.model)
    started = time.monotonic()
    try:
        again = reducer.oracle.run_again(path, ride.feeds, ride.reference)
    finally:
        os.remove(path)
    # its own line in summary.json's steps: "confirm" for a folded confirmation, else "replay"
    stats = reducer.stats.setdefault("confirm" if ride.folded else "replay", PassStats())
    stats.calls, stats.candidates = stats.calls + 1, stats.candidates + 1
    stats.note_built(len(ride.model.graph.node), heavy_layers(ride.model))
    stats.seconds += time.monotonic() - started
    reducer.original_replay = reducer.original_replay.replace(f"riding with the {ride.carrier}",
                                                              f"in a call of its own (the {ride.carrier} did not "
                                                              "carry it)")
    if ride.folded:
        reducer.confirmed = f"alone: {why or f'the {ride.carrier} did not carry it'}"
    ride.check(again)


def _run_numeric_pack(reducer, group: list[Member]) -> dict:
    """One packed call for ``group`` (split in halves when the engine refuses the whole);
    returns {member: Outcome} for the members that are candidates (not the marked model)."""
    if not any(m.replay for m in group):
        _confirm_first(reducer)
    if len(group) == 1:
        member = group[0]
        if member.replay:
            run_replay_alone(reducer)
            return {}
        if member.nodes is None:
            _run_marked_alone(reducer, member.sub)
            return {}
        return {member: judge_member(reducer, member)[0]}
    big = len(group) >= BIG_PACK  # the silent stretches of a big model: say each phase
    if big:
        reducer.event(f"{reducer.step}: packing {len(group)} candidates into one model")
    with reducer.tally.timing("pack"):
        pack = build_pack([m.sub for m in group], keep_node_names=False, same_node_names=reducer.names_select_nodes,
                          share_feeds=reducer.share_feeds)
    reducer.charge()
    path = save_candidate(reducer, pack.model)
    if big:
        reducer.event(f"{reducer.step}: one target call for {len(group)} candidates ({pack.nodes} nodes)")
    start = time.monotonic()
    try:
        result = reducer.oracle.run_target(path, pack.feeds)
    finally:
        os.remove(path)
    reducer.note_call(pack.nodes, sum(1 for m in group if m.nodes is not None), time.monotonic() - start,
                      built_by(group, pack.nodes), heavy_built=heavy_layers(pack.model))
    if result.status != "ok":  # the engine refused the pack as a whole: find out who, by halves
        if result.status == "memory":  # said: the halves cost calls whose reason the user would not see
            reducer.event(f"{reducer.step}: a pack of {len(group)} candidates {result.message}: split in halves")
        result.discard()
        if any(m.replay for m in group):  # the original first, alone: it may be what failed
            run_replay_alone(reducer, "the packed call that held it failed as a whole")
            group = [m for m in group if not m.replay]
            if len(group) < 2:
                return _run_numeric_pack(reducer, group) if group else {}
        half = len(group) // 2
        return {**_run_numeric_pack(reducer, group[:half]), **_run_numeric_pack(reducer, group[half:])}
    if big:
        reducer.event(f"{reducer.step}: comparing the outputs of {len(group)} candidates")
    try:
        with reducer.tally.timing("compare"):
            return _judge_pack_outputs(reducer, pack, group, result)
    finally:
        result.discard()


def _judge_pack_outputs(reducer, pack, group: list[Member], result) -> dict:
    """Each member of one packed call judged from its own outputs: {member: Outcome}."""
    found = {}
    for packed, member in zip(pack.members, group):
        outputs = {original: result.outputs[name] for name, original in packed.outputs.items()
                   if name in result.outputs}
        if member.replay:
            _replayed(reducer, WorkerResult("ok", outputs=outputs, meta=result.meta, seconds=result.seconds))
            continue
        if member.nodes is None:
            _layerwise_from(reducer, outputs)
            continue
        reference = _reference(reducer, member)
        if set(outputs) != set(packed.outputs.values()) or set(reference) != set(outputs):
            outcome = Outcome(False, "build-error", "target output missing", None, packed=True)
        else:
            own = WorkerResult("ok", outputs=outputs, meta=result.meta, seconds=result.seconds)
            # full=False: a member's outcome reads only its signature and error (never the last
            # word: a result is judged alone, with every number, before it is kept)
            verdict = reducer.oracle.verdict_from(own, reference, full=False,
                                                  keep_outputs=_causal_for(reducer, member) is not None)
            outcome = _outcome(reducer, verdict, packed=True, member=member)
            if outcome.interesting and not member.crop:  # where the shapes pass will crop around
                reducer.hotspots[member.nodes] = hotspot(outputs, reference)
        found[member] = reducer.record(member.nodes, outcome, crop=member.crop)
    return found

