"""The last step of a shrink run: the result judged alone — and, where shapes shrink, the result
is the smallest input crop that held, so that one judgement (and its replays) is the final call.

Order, per best (the latest accepted first, then up to two earlier ones when a best does not
reproduce alone): for a numeric signature the shapes pass judges its crop ladder in one packed
call (``passes/shapes.py``); for a pass/fail one it proposes its smallest crop unjudged. The
first crop is judged alone, replayed where the engine is not deterministic; when it holds it is
the result, else the uncropped best is judged alone as before. A run whose other input samples
are judged on the node-minimal model judges that model alone first and crops after.
Must not search: it only judges what the passes and the shapes pass hand it.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field

from reprokit.engine.bug import Decision, judge, shows_bug
from reprokit.errors import NothingRemoved, NotReproduced
from reprokit.graph.io import save_model
from reprokit.graph.model import node_label
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.clock import StepClock
from reprokit.shrink.confirm import flaky_tally
from reprokit.shrink.evaluator import causal_nodes, causal_test, run_replay_alone
from reprokit.shrink.exclusion import offer_exclusion
from reprokit.shrink.passes.shapes import (
    MIN_ELEMENTS,
    Shapes,
    declare_output_shapes,
    elements,
    report,
)
from reprokit.shrink.samples import judge_minimal
from reprokit.spec import parse_target
from reprokit.standalone.emulation import clamped_constants

NUMERIC_KINDS = ("nonfinite", "mismatch")  # judged by their values; the rest pass or fail


@dataclass
class ShrinkResult:
    summary: dict
    out_dir: str
    minimal_path: str
    verdict: object
    notes: list[str] = field(default_factory=list)
    clock: StepClock | None = None  # the run's steps go on after it returns (audit, pack): clock.py


def finish(run, reducer, writer, store, replays: int, note: str, message: str = "") -> ShrinkResult:
    """The last word is a single model judged alone (and replayed where the engine is not
    deterministic) before it is written as done. A best that does not reproduce alone falls back
    to the previous accepted best (twice at most), then stops with its own outcome."""
    tried: list[str] = []
    verdicts = []
    for position, nodes in enumerate(list(dict.fromkeys(reversed(reducer.history)))[:3] or [reducer.best]):
        if tried and writer.max_calls and run.oracle.stats.target + 1 + replays > writer.max_calls - writer.earlier_calls:
            break  # a fallback would pass the budget (--max-calls is a promise): not reproduced
        final = reducer.extraction(nodes)
        reference = {n: store.get(n) for n in final.outputs if n in store}
        whole = len(nodes) >= len(run.model.graph.node) > 1 and not reducer.one_minimal
        crops_first = position == 0 and not run.prepared.sample_verdicts and not whole
        crops = _crops(run, reducer, writer, nodes, final, reference, replays, message) if crops_first else []
        for attempt in crops[:1]:
            # a crop judged in the shapes pack was run once already: that run is its first replay
            again = max(0, replays - 1) if reducer.packing == "numeric" else replays
            verdicts = _judged(run, reducer, attempt.model, attempt.feeds, attempt.reference, again, nodes,
                               tried, f"{len(nodes)} nodes at {elements(attempt.feeds)} input elements")
            if _shows_all(run, reducer, writer, verdicts, nodes):
                declare_output_shapes(attempt.model, attempt.reference)
                writer.shapes = report(final.model, final.feeds, attempt, reducer.stats["shapes"].calls)
                return _done(run, reducer, writer, nodes, tried, note, attempt.model, attempt.feeds,
                             attempt.reference, verdicts[0])
        verdicts = _judged(run, reducer, final.model, final.feeds, reference, replays, nodes, tried,
                           f"{len(nodes)} nodes", causal=True)
        if _shows_all(run, reducer, writer, verdicts, nodes, causal=True):
            if whole:
                _nothing_removed(run, reducer, writer, final, verdicts[0], reference, note)
            model, feeds, verdict = final.model, final.feeds, verdicts[0]
            writer.samples = judge_minimal(run, reducer, nodes, final, verdict)  # on the other failing samples
            if not crops_first:
                crops = _crops(run, reducer, writer, nodes, final, reference, replays, message, after=True)
                for attempt in crops[:1]:
                    again = _judged(run, reducer, attempt.model, attempt.feeds, attempt.reference, 0, nodes, [], "")
                    if shows_bug(reducer.held_for(nodes), again[0]):
                        declare_output_shapes(attempt.model, attempt.reference)
                        writer.shapes = report(final.model, final.feeds, attempt, reducer.stats["shapes"].calls)
                        model, feeds, reference, verdict = attempt.model, attempt.feeds, attempt.reference, again[0]
            return _done(run, reducer, writer, nodes, tried, note, model, feeds, reference, verdict)
    run_replay_alone(reducer)  # a flaky original is said as such, before the result is called not reproduced
    writer.write(reducer, "not-reproduced", final_verdict=verdicts[0],
                 note="the minimal model does not reproduce alone: " + " | ".join(tried))
    raise NotReproduced(
        f"the reduced model does not show {reducer.signature.describe()} when judged alone ({tried[0]})",
        hint="the target is flaky or the divergence needs more context; rerun with --replays 2, or "
             f"look at {run.out_dir}/summary.json (steps, other_findings)")


def _judged(run, reducer, model, feeds, reference, replays: int, nodes, tried: list, label: str, *,
            causal: bool = False) -> list:
    """One model judged alone, then replayed while it diverges: the final step's calls.
    ``causal``: the node-minimal model (a crop has no full-size values to inject)."""
    reducer.begin("final")
    calls_before = run.oracle.stats.target
    started = time.monotonic()
    judged = save_model(model, os.path.join(run.models_dir, "final.onnx"),
                        base_dir=run.prepared.base_dir, self_contained=True)
    verdicts = [run.oracle.judge(judged, feeds, reference_outputs=reference,
                                 keep_outputs=causal and reducer.causal is not None)]
    if replays and verdicts[0].cached and reducer.signature.kind.value not in NUMERIC_KINDS:
        # a pass/fail result was chosen because its one call alone failed: that call is no
        # evidence for it (a coin lands on some node); a replayed result runs fresh 1 + replays times
        replays += 1
    for _ in range(replays if verdicts[0].diverges else 0):
        verdicts.append(run.oracle.run_again(judged, feeds, reference))
    made = run.oracle.stats.target - calls_before
    reducer.stats["final"].calls += made
    reducer.stats["final"].note_built(len(nodes), heavy_layers(model), calls=made)
    reducer.stats["final"].candidates += 1
    reducer.stats["final"].seconds += time.monotonic() - started
    if label:
        tried.append(f"{label}: " + ", ".join(v.signature.describe() for v in verdicts))
    return verdicts


def _shows_all(run, reducer, writer, verdicts: list, nodes, *, causal: bool = False) -> bool:
    """Do all runs show the signature? One model with two answers is a flaky target: stop."""
    if causal:
        first = judge(reducer.signature, verdicts[0], causal=causal_test(reducer), nodes=causal_nodes(reducer, nodes))
        reducer.no_slippage["final"] = first.describe()
        # a replay has no values to inject: it must show what the first run showed (an Inf whose
        # injection caused the original's mismatch stays an Inf)
        held = verdicts[0].signature if first.shows else reducer.signature
    else:  # a crop: held to what its node set showed (Reducer.held_for), no values to inject
        held = reducer.held_for(nodes)
        first = judge(held, verdicts[0])
        reducer.no_slippage["final"] = first.describe() + (" (a shape crop)" if first.shows else "")
    shows = [first.shows] + [shows_bug(held, v) for v in verdicts[1:]]
    said = ""
    if shows[0] and not all(shows):
        said = flaky_tally(verdicts, reducer.signature)
    elif not shows[0] and causal and reducer.signature.kind.value not in NUMERIC_KINDS:
        seen = reducer.cached(nodes)
        if seen is not None and seen.interesting and not (seen.packed or seen.inferred):
            # this very model failed when the search judged it alone: a pass now is the same
            # model's second answer, not a result that needs more context — never a fall back
            # to a larger model (a coin would pass one of those too)
            said = flaky_tally(verdicts, reducer.signature) + "; it failed when the search judged it alone"
    if said:
        # One model, two answers: the target is flaky. A larger model would only be luckier.
        writer.write(reducer, "flaky", final_verdict=verdicts[-1], note=f"the target is flaky: {said}")
        raise NotReproduced(
            f"the target is flaky: runs of the reduced model ({len(nodes)} nodes) disagree: {said}",
            hint="a flaky check reduces noise, not the bug: make it give one answer per model (fixed "
                 "tactics, a timing cache, a deterministic checker), or raise --replays to be sure")
    return all(shows)


def _done(run, reducer, writer, nodes, tried, note, model, feeds, reference, verdict) -> ShrinkResult:
    run_replay_alone(reducer)  # the original's replay, where no packed call carried it
    reducer.best = frozenset(nodes)
    failed = tried[:-1]
    choice = emulation_choice(run.target, model)
    if choice:  # console, summary.json (emulation_choice, warnings) and ISSUE.md (its warnings)
        writer.emulation_choice = choice
        writer.warnings = [*writer.warnings, choice]
        note = (note + "; " if note else "") + choice
    if verdict.kind is not reducer.signature.kind:  # the causal test accepted another kind (bug.py)
        said = (f"the minimal shows {verdict.signature.describe()}; injected into the original's reference run, "
                f"its values cause the original's {reducer.signature.describe()} (the causal test)")
        note = (note + "; " if note else "") + said
    if failed:
        note = (note + "; " if note else "") + "smaller results did not reproduce alone: " + " | ".join(failed)
    writer.fixes_alone = fixes_alone(run, reducer, nodes)
    if writer.fixes_alone["answer"] == "no":  # console, summary.json and ISSUE.md (its warnings)
        said = "fixing this alone does not fix the model: " + writer.fixes_alone["why"]
        writer.warnings = [*writer.warnings, said]
        note = (note + "; " if note else "") + said
    writer.write(reducer, "done", final_verdict=verdict, minimal_model=model, feeds=feeds,
                 reference=reference, note=note)
    if run.oracle.quant is not None:  # pack judges the minimal's outputs in the steps this run judged them in
        writer.summary["quant_steps"] = run.oracle.quant.recorded(o.name for o in model.graph.output)
    notes = run.prepared.notes + ([note] if note else [])
    if run.options.reference_model:  # the user's fix is an AutoCast exclusion: found and tested here
        notes += offer_exclusion(run, writer, nodes)
    return ShrinkResult(writer.summary, run.out_dir, os.path.join(run.out_dir, "minimal.onnx"), verdict, notes,
                        writer.clock)


def fixes_alone(run, reducer, nodes) -> dict:
    """Does fixing the minimal alone fix the original? The causal test proves the minimal
    sufficient, not necessary. For free (no call, no run), from the survey's decisions: another
    node outside the minimal whose own values, fed reference inputs, cause the original symptom
    too (two independent overflows reaching one output) means "no". "not shown otherwise" only
    where every node was judged alone and none other causes it; else "unknown"."""
    label = lambda i: node_label(reducer.model.graph.node[i], i)  # noqa: E731
    if reducer.causal is None or reducer.causal.model is not reducer.model or not reducer.isolated:
        return {"answer": "unknown", "why": "the nodes were not each judged alone by the causal test"}
    others = [i for i, o in sorted(reducer.isolated.items()) if o.decision is Decision.CAUSAL and i not in nodes]
    if others:
        named = ", ".join(label(i) for i in others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return {"answer": "no", "why": f"{named} alone also cause{'s' if len(others) == 1 else ''} the original's "
                f"{reducer.signature.kind.value} (the causal test, in the survey)", "other_causes": [label(i) for i in others]}
    if len(reducer.isolated) < len(reducer.model.graph.node):
        return {"answer": "unknown", "why": f"{len(reducer.isolated)} of {len(reducer.model.graph.node)} nodes were "
                "judged alone (the survey stopped at its first hit, or packed by build cost at the nodes "
                "where a NaN/Inf is born)"}
    return {"answer": "not shown otherwise", "why": "no other node causes the original's symptom alone (every node "
            "judged alone); errors that only add up are not excluded"}


def emulation_choice(target: str, model) -> str:
    """Words for a finding that depends on how the emulator stores constants, or ""."""
    spec = parse_target(target)
    if spec.engine != "emulate" or not spec.has("fp16"):
        return ""
    clamped = clamped_constants(model, "fp16")
    if not clamped:
        return ""
    named = ", ".join(name for name, _ in clamped[:3])
    return (f"this finding depends on an emulation choice: emulate:fp16 clamps infinite constants to ±65504 "
            f"(here {named}), as TensorRT clamps weights past fp16's range; whether your engine does that to this "
            "constant or keeps the inf (fp16 holds it) is not known here: confirm it on the engine (commands.sh)")


def _nothing_removed(run, reducer, writer, final, verdict, reference, note: str) -> None:
    """No node removed and none proven needed: the bug is confirmed, the model is not reduced.
    Its own status and exit code, never "done"."""
    why = ("the call budget ran out first" if reducer.stopped else
           "no smaller candidate showed the bug on its own (nodes that fail only together, or a check "
           "that needs the whole model)")
    writer.write(reducer, "nothing-removed", final_verdict=verdict, minimal_model=final.model, feeds=final.feeds,
                 reference=reference, note=(note + "; " if note else "") + f"nothing removed: {why}")
    raise NothingRemoved(
        f"the bug is confirmed ({reducer.signature.describe()}) but no node was removed: {why}",
        hint=(f"continue with a larger budget: reprokit shrink --resume {shlex.quote(run.out_dir)} --max-calls 0"
              if reducer.stopped else "name the failure with --fail-regex, or try --one-by-one; "
              f"{run.out_dir}/summary.json says what was tried"))


def _known(run, final) -> bool:
    """Has the node-minimal model been judged alone already (its verdict cached)?"""
    path = save_model(final.model, os.path.join(run.models_dir, "final.onnx"),
                      base_dir=run.prepared.base_dir, self_contained=True)
    return run.oracle.knows(path, final.feeds)


def _crops(run, reducer, writer, nodes, final, reference, replays: int, message: str, *, after: bool = False):
    """The shapes pass on this best, within what is left of the call budget once the final
    judgement (and its replays) is reserved: crops that held, smallest first."""
    if not run.shrink_shapes or elements(final.feeds) <= MIN_ELEMENTS:
        return []
    shapes = Shapes(reducer, nodes, run.models_dir)
    if shapes.skips(message):
        run.prepared.notes.append("shapes not shrunk: the failure's message names no shape")
        return []
    numeric = reducer.packing == "numeric"
    left = None
    if writer.max_calls:
        # calls still allowed after the crop's own judgement alone and its replays (not
        # reserved when the uncropped model was judged already, ``after``)
        left = writer.max_calls - writer.earlier_calls - run.oracle.stats.target - (0 if after else 1 + replays)
        # after: the pack and the crop alone; before: the pack, and the uncropped model judged
        # alone with its replays should the crop not hold alone (no call where it was judged
        # alone already: the verdict cache answers)
        needed = 1 + numeric if after else numeric + (not _known(run, final)) + replays
        if left < max(1, needed):
            run.prepared.notes.append("shapes not shrunk: the call budget is spent (--max-calls)")
            return []
    reducer.begin("shapes")
    reducer.budget = None if left is None else reducer.spent + left
    found = shapes.tries(final.model, final.feeds, list(reference), reducer.hotspots.get(frozenset(nodes)))
    if found:
        run.event(f"shapes: {found[0].label} ({elements(found[0].feeds)} of {elements(final.feeds)} input elements)")
    return found
