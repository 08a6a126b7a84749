"""shrink, as named steps: open the run (control flow opened: ``opening.py``), capture the
reference activations, confirm the divergence (``confirm.py``), make the Reducer and hold it to
the original's verdict (``reducer_setup.py``), reduce (``pipeline.py``), finish with the result
judged alone. Best-so-far results are rewritten after every accepted step (``output.py``);
``resume`` replays the journal of candidate outcomes and continues (``runstate.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

from reprokit.engine.oracle import Kind, Signature, check_reference_finite
from reprokit.engine.session import RunOptions
from reprokit.errors import (
    EngineUnavailable,
    NothingRemoved,
    NothingToReduce,
    NotReproduced,
)
from reprokit.graph.index import count_nodes
from reprokit.graph.io import weight_bytes
from reprokit.shrink import pipeline
from reprokit.shrink.accumulated import finish_accumulated
from reprokit.shrink.budget import (
    SHAPE_CALLS,
    Limits,
    auto_call_budget,
    check_budget,
    default_replays,
    earlier_calls,
    inside_allowance,
    pack_memory,
    packs_share_feeds,
)
from reprokit.shrink.clock import StepClock
from reprokit.shrink.confirm import (
    ConfirmBeside,
    FoldedConfirm,
    RideAlong,
    Unfold,
    can_fold,
    confirm,
    confirms_beside_capture,
    probe_pending,
    refuse_model_blind_check,
    replays_go_to_result,
)
from reprokit.shrink.evaluator import run_replay_alone
from reprokit.shrink.final import ShrinkResult, finish
from reprokit.shrink.opening import keep_opening, reprokit_built
from reprokit.shrink.output import _BestWriter, pack_result  # noqa: F401  (pack_result: the CLI's)
from reprokit.shrink.passfail import NO_PACK_PASSED, Calibration, calibrate_packs, result_replays
from reprokit.shrink.precalibrate import as_calibration, precalibrate
from reprokit.shrink.precalibrate import wanted as precalibration_wanted
from reprokit.shrink.reducer import PassStats
from reprokit.shrink.reducer_setup import hold_to, make_reducer
from reprokit.shrink.runstate import (  # noqa: F401  (the CLI's and tests': saved_run, resume_hint …)
    _with_timing_cache,
    option_args,
    rerun_command,
    resume_hint,
    saved_run,
)
from reprokit.shrink.samples import sample_calls, samples_summary
from reprokit.shrink.start import capture, open_run
from reprokit.spec import parse_target


def shrink(model_path: str, target: str, out_dir: str, *, options: RunOptions | None = None,
           jobs: int = 1, replays: int | None = None, resume: bool = False, localize_first: bool = True,
           on_event=None, limits: Limits | None = None, pack_candidates: bool = True,
           search_accumulated: bool = False, accept_milder: bool = False, keep_inputs: bool = False,
           keep_outputs: bool = False, shrink_shapes: bool = True, clock: StepClock | None = None,
           run_args: tuple = (), fold_constants: bool = True) -> ShrinkResult:
    """Reduce ``model_path`` to a minimal model that shows the same divergence under ``target``.
    The steps: open the run, capture, confirm, reduce (reduce/pipeline.py), finish. ``clock``
    (the CLI's, started with the process) times the steps; by default they start here. ``run_args``:
    the command's own options (--max-calls, --no-pack …) as arguments, kept in run.json so that
    ``--resume`` continues with every option of the run. ``fold_constants``: the model's constant
    subgraphs are folded (checked on the reference) before anything is judged, node names kept
    (``engine/folding.py``); False reduces the model exactly as given."""
    options = options or RunOptions()
    limits = limits or Limits()
    check_budget(target, limits.max_calls, replays, resume)
    clock = clock or StepClock(time.monotonic(), first="setup")
    clock.begin("setup")
    # what steers the search: a resumed run replays journaled verdicts of a search made under these
    search = {"localize": localize_first, "pack": pack_candidates, "search_accumulated": search_accumulated,
              "accept_milder": accept_milder, "keep_inputs": keep_inputs, "keep_outputs": keep_outputs,
              "shrink_shapes": shrink_shapes, "fold_constants": fold_constants}
    within = min(limits.capture_chunk_bytes, limits.max_activation_disk_bytes or limits.capture_chunk_bytes)
    run = open_run(model_path, target, out_dir, options, resume, on_event or (lambda text: None), clock, run_args,
                   search, capture_within=within)
    run.shrink_shapes = shrink_shapes
    # a pass/fail check's confirming call reads no reference value: it runs beside the capture
    beside = ConfirmBeside(run) if confirms_beside_capture(run, resume) else None
    try:
        clock.begin("capture")
        store = reprokit_built(
            "capturing reference activations (every tensor marked as an output)",
            lambda: capture(run.oracle, run.model, run.index, run.feeds, [t for outs in run.index.node_outputs for t in outs],
                             run.state_dir, run.models_dir, resume, limits, run.event, run.prepared.check_capture),
            run.oracle, run.prepared.path, run.feeds)
        run.event("capturing reference activations: done")
        graph_outputs = {name: store.get(name) for name in run.index.graph_outputs if name in store}
        check_reference_finite(graph_outputs, run.oracle.reference)
        # The data of one marked run of the model (weights, feeds, every activation) bounds a pack's.
        weights = weight_bytes(run.model)
        marked_run = weights + sum(getattr(v, "nbytes", 0) for v in run.feeds.values()) + store.nbytes()
        share_feeds = packs_share_feeds(run.target)
        limits = replace(limits, pack_memory_bytes=pack_memory(limits, marked_run, share_feeds))
        original_replays, minimal_replays = default_replays(run.target) if replays is None else (replays, replays)
        asked = _Asked(model_path, out_dir, options, clock, limits, jobs, original_replays, minimal_replays,
                       pack_candidates, localize_first, search_accumulated, accept_milder, keep_inputs, keep_outputs,
                       shrink_shapes, resume, share_feeds,
                       weights_fit=weights <= limits.pack_memory_bytes // 2)
        fold = can_fold(run, replays=original_replays, packing=pack_candidates, localize=localize_first, resume=resume,
                        weights_fit=asked.weights_fit)
        try:
            return _confirm_and_reduce(run, store, graph_outputs, asked, fold=fold, beside=beside)
        except Unfold as unfolded:  # the survey's pack did not confirm a numeric divergence: as usual,
            return _confirm_and_reduce(run, store, graph_outputs, asked, first=unfolded.verdict,  # no call twice
                                       unfolded=unfolded.confirmed)
    except BaseException:
        if beside is not None:  # the capture failed or was interrupted: the check's call goes too
            beside.abandon()
        raise


@dataclass
class _Asked:
    """What the command asked of one shrink run, past its opening and capture."""

    model_path: str
    out_dir: str
    options: RunOptions
    clock: StepClock
    limits: Limits
    jobs: int
    original_replays: int
    minimal_replays: int
    pack_candidates: bool
    localize_first: bool
    search_accumulated: bool
    accept_milder: bool
    keep_inputs: bool
    keep_outputs: bool
    shrink_shapes: bool
    resume: bool
    share_feeds: bool
    weights_fit: bool  # a copy of the model's weights fits a pack beside the other members


# The signature a folded confirmation's reducer is built with: no candidate is judged under it
# (confirm.FoldedConfirm holds the run to the original's own before any is).
_PENDING = SimpleNamespace(signature=Signature(Kind.MISMATCH, detail="pending"), warnings=(), message="")


def _confirm_and_reduce(run, store, graph_outputs: dict, asked: _Asked, *, fold: bool = False,
                        first=None, unfolded: str = "", beside: ConfirmBeside | None = None) -> ShrinkResult:
    """Confirm, reduce, finish. ``fold``: the confirming judgement is the survey's first packed
    call's first member (confirm.FoldedConfirm); ``first``: the original's verdict already seen
    there (``unfolded``: where); ``beside``: the confirming call made beside the capture."""
    clock, limits, resume = asked.clock, asked.limits, asked.resume
    original_replays, minimal_replays = asked.original_replays, asked.minimal_replays
    clock.begin("confirm")
    if beside is not None:
        first = beside.verdict()
    cmd = parse_target(run.target).engine == "cmd"

    def ride(seen) -> str:  # the original's last replay rides in a call sure to come (issue 25)
        packing = pipeline.packing_for(seen.signature.kind, asked.pack_candidates)
        if packing == "numeric" and asked.localize_first and not resume and asked.weights_fit:
            return "survey's packed call"
        return ""

    pre = None  # a numeric check command's calibration pack, run first: it may confirm too
    if fold:
        verdict, ride_along = _PENDING, None
        run.event("confirming the divergence: the original rides as the first member of the survey's packed call")
    else:
        if first is None and precalibration_wanted(run, pack=asked.pack_candidates, resume=resume,
                                                   weights_fit=asked.weights_fit):
            pre = precalibrate(run, graph_outputs, clock)
        verdict, ride_along = confirm(run, graph_outputs, original_replays, ride,
                                      first or (pre.original if pre is not None and pre.confirms() else None),
                                      where="judged beside the capture" if beside is not None else "judged already",
                                      model_file=beside.path if beside is not None else None)
    moved = replays_go_to_result(run.target, verdict)
    if moved:  # a pass/fail check's original is not replayed: its runs go to the result (issue 39)
        original_replays, minimal_replays = 0, minimal_replays + original_replays
    confirmed_calls = run.oracle.stats.target
    wrap = keep_opening(run, store, graph_outputs, verdict)
    opening_calls = run.oracle.stats.target - confirmed_calls
    signature = verdict.signature
    # A build error needs no run: engines that can stop after building (TensorRT) do so.
    run.oracle.build_only = signature.kind is Kind.BUILD_ERROR

    original_nodes = len(run.model.graph.node)
    reducer = make_reducer(run, store, verdict, wrap, clock, limits, jobs=asked.jobs,
                            pack_candidates=asked.pack_candidates, share_feeds=asked.share_feeds,
                            keep_inputs=asked.keep_inputs, keep_outputs=asked.keep_outputs,
                            accept_milder=asked.accept_milder, pending=fold)
    if beside is not None:
        reducer.confirmed = ("a call of its own, beside the reference capture (a pass/fail check reads no reference "
                             "values)")
    if unfolded:
        reducer.confirmed = (f"{unfolded}: it showed {verdict.signature.kind.value} there, not a numeric divergence, "
                             "and the run went on as one confirmed alone")
    samples_spent, samples_reserved = sample_calls(run.prepared)  # several input samples: each judged
    folded = _before_search(run, reducer, verdict, ride_along, original_replays, cmd, pre, graph_outputs)
    if moved and asked.original_replays and "replay" not in reducer.stats:  # else the calibration asked it
        reducer.original_replay = ("none: a pass/fail check's failing original is not replayed; its replays are "
                                   "fresh runs of the result (final)")
    # the auto budget reserves one call less where the replay (or a folded confirmation) rides
    # along: the pack is a call anyway
    max_calls = (auto_call_budget(original_nodes, original_replays - (folded or fold) + minimal_replays) + opening_calls
                 + samples_spent + samples_reserved + (SHAPE_CALLS if asked.shrink_shapes else 0) + run.probe_calls
                 + (inside_allowance(count_nodes(run.model.graph) - original_nodes + (original_nodes if wrap else 0))
                    if reducer.reach_inside else 0)
                 if limits.max_calls == -1 else limits.max_calls)
    earlier = earlier_calls(asked.out_dir) if resume else 0
    if resume and limits.max_calls == -1:
        max_calls += run.journal.claimed()  # the allowances the interrupted run was granted (Reducer.claim)
    writer = _writer_for(run, asked.model_path, asked.options, verdict, clock, max_calls, earlier)
    pending = _fold_into_survey(run, reducer, writer, graph_outputs, asked, original_replays) if fold else None
    # no best-so-far file before the original's replay held (it rides in a later packed call)
    reducer.on_accept = lambda r, step: writer.write(r, "running") if r.ride_along is None else None
    reducer.shapes = asked.shrink_shapes  # crops may ride along in earlier packs (localize)
    if limits.max_calls == -1:
        def widen(calls: int) -> int:  # a pass with a known cost bound claims it (the conflict search)
            calls = max(0, calls)
            writer.max_calls += calls
            return calls

        reducer.allowance = widen
    if max_calls:  # a promise: every target call counts (a resumed run's too), the final is reserved
        reducer.budget = max(0, max_calls - earlier - run.oracle.stats.target - 1 - minimal_replays - samples_reserved)
    try:
        outcome = pipeline.reduce(reducer, pipeline.Plan(localize=asked.localize_first, pack=asked.pack_candidates,
                                                         search_accumulated=asked.search_accumulated),
                                  message=verdict.message)
        if pending is not None:  # a folded confirmation no packed call carried: the original alone
            if pending.verdict is None:
                run_replay_alone(reducer)
            verdict = pending.verdict
        _probe(run, reducer, verdict)
        reducer.close()
        if reducer.causal is not None and reducer.causal.model is not reducer.model:
            reducer.no_slippage["after_inside"] = ("the inside step reduced inside If branches: its candidates and the "
                                                   "final judgement are injected by the names of their outputs "
                                                   "(no cone test); one with no top-level output is held to its "
                                                   "signature, counted in `accepted`")
        if outcome == "accumulated":
            run_replay_alone(reducer)  # the original's replay, where no packed call carried it
            said, window = finish_accumulated(run, reducer, writer, verdict)
            return ShrinkResult(writer.summary, run.out_dir, window, verdict, run.prepared.notes + [said],
                                writer.clock)
        note = ""
        if outcome == "budget":
            reducer.stopped = True
            note = (f"stopped at the call budget ({writer.max_calls} target calls, --max-calls); the model is the "
                    "smallest found so far. `--resume` with a larger --max-calls (0: no limit) continues")
            run.event(note)
        if reducer.contradictions and minimal_replays:
            # groups that failed with no member failing alone: a flaky check, or members that
            # fail only together; either way the result earns two more runs before "done" —
            # within the budget, which is a promise
            spare = None if not max_calls else max_calls - earlier - run.oracle.stats.target - 1 - minimal_replays
            minimal_replays += 2 if spare is None else max(0, min(2, spare))
        if moved:
            minimal_replays = result_replays(reducer, minimal_replays, run.probed)
        return finish(run, reducer, writer, store, minimal_replays, note, verdict.message)
    except BaseException as exc:
        reducer.close(interrupted=True)
        if isinstance(exc, Unfold):
            exc.confirmed = reducer.confirmed
        if (isinstance(exc, (NotReproduced, NothingRemoved, NothingToReduce, Unfold)) or run.refused
                or (pending is not None and pending.verdict is None)  # the 1st: a flaky replay; refused: the
                or (reducer.ride_along is not None and reducer.history)):  # check fails on anything; Unfold:
            raise  # again; a folded original not judged yet, or a best kept before its replay: nothing to write
        interrupted = isinstance(exc, KeyboardInterrupt)
        try:
            writer.write(reducer, "interrupted" if interrupted else "failed")
        except Exception:  # the disk may be what failed: keep the previous best-so-far as it is
            pass
        raise


def _fold_into_survey(run, reducer, writer, graph_outputs: dict, asked: _Asked, replays: int) -> FoldedConfirm:
    """The original, pending as the first member of the survey's first packed call: its verdict
    there holds the reducer to the signature (and the writer to its warnings) before any other
    member of the pack is judged. Its replay (``replays``: at most one) is then pending for the
    next packed call (the survey's next pack, localize's, the pairs', the shapes ladder's), else
    a call of its own before the result is written (final._done, the accumulated end): no file
    says more than the replay allowed — no best-so-far file is written while it is pending."""
    model = run.given if run.given is not None else run.model

    def held(seen) -> None:
        hold_to(run, reducer, seen, asked.accept_milder)
        writer.warnings = list(seen.warnings)
        run.prepared.notes.extend(f"warning: {w}" for w in seen.warnings)
        run.event(f"diverges: {seen.signature.describe()}")
        if replays:
            reducer.ride_along = RideAlong(model, run.feeds, graph_outputs, [seen],
                                           rerun_command(run.model_path, run.target, run.options), "next packed call")

    pending = FoldedConfirm(model, run.feeds, graph_outputs, held)
    reducer.ride_along = pending
    reducer.confirmed = "the first member of the survey's packed call"
    if replays:
        reducer.original_replay = "0 call(s) of its own at confirm and one riding with the next packed call"
    return pending


def _before_search(run, reducer, verdict, ride_along, original_replays: int, cmd: bool, pre=None,
                   graph_outputs: dict | None = None) -> bool:
    """A check command's calibration (``pre``: made before the confirmation, precalibrate.py),
    the original's replay alone where no packed call will carry it, and what the run holds back
    from the passes' budget: the pending replay, the pending calibration, the Identity probe
    until a call passes. Returns whether the original's replay rode in a call that came anyway."""
    folded = ride_along is not None
    reducer.ride_along = ride_along
    reducer.original_replay = ("none" if not original_replays else
                               f"{original_replays - folded} call(s) of its own at confirm"
                               + (f" and one riding with the {ride_along.carrier}" if folded else ""))
    def original_alone() -> None:  # a calibration pack passed a model known to fail: the original decides
        model = run.given if run.given is not None else run.model
        reducer.ride_along = RideAlong(model, run.feeds, graph_outputs or {}, [verdict],
                                       rerun_command(run.model_path, run.target, run.options), "calibration pack")
        run_replay_alone(reducer)
        reducer.original_replay = ("1 call of its own, after the calibration pack passed it (a check that reads part "
                                   "of a pack, or one that fails at random); the others are fresh runs of the result")

    if reducer.packing == "group" and cmd and pre is None:
        # one call, made when a pack first passes (passfail.group_fails), with the smallest model
        # seen failing then: a run that never packs (a named node, the conflict search's windows)
        # or whose packs all fail never pays for it (a calibration made before the confirmation,
        # ``pre``, was paid already: taken below)
        reducer.calibration = Calibration(lambda pending: calibrate_packs(reducer, run.event, pending=pending,
                                                                          decide=original_alone))
        reducer.no_slippage["packs"] = NO_PACK_PASSED
        run.probe_calls += 1
        folded = False
    elif reducer.packing is not None and cmd:  # one call: does the check judge a whole pack?
        calls = run.oracle.stats.target
        calibrate_packs(reducer, run.event, pre and as_calibration(run, reducer, pre), decide=original_alone)
        run.probe_calls += 1  # the calibration
        folded = folded and run.oracle.stats.target - calls == (pre is None)
    if reducer.packing != "numeric" and reducer.ride_along is not None and reducer.calibration is None:
        run_replay_alone(reducer)  # no packed call will carry it
        folded = False
    run.probe_calls += cmd  # the Identity probe (confirm.py), held back until a call of the run passes
    reducer.held = lambda: (probe_pending(run) + (reducer.ride_along is not None) + (reducer.calibration is not None))
    # before a best is kept, the Identity probe where no call passed (a pass/fail check's
    # original owes no replay: issue 39, so nothing waits for a calibration to carry one)
    reducer.before_accept = lambda: _probe(run, reducer, verdict)
    return folded


def _probe(run, reducer, verdict) -> None:
    """No call of the run passed yet and a best is about to be kept: does the check fail on
    anything (confirm.py)? Its call is a step of its own in summary.json; the pass it comes in
    goes on after it."""
    if not probe_pending(run):
        return
    clock, step = reducer.clock, reducer.step
    if clock is not None:
        clock.begin("probe")
    started, before = time.monotonic(), run.oracle.stats.target
    try:
        refuse_model_blind_check(run, verdict)
    except EngineUnavailable:
        run.refused = True  # nothing is written: no result of a check that does not look at the model
        raise
    finally:
        made = run.oracle.stats.target - before
        reducer.stats["probe"] = PassStats(calls=made, candidates=made, seconds=time.monotonic() - started)
        reducer.stats["probe"].note_built(1, 0, calls=made)  # a one-node Identity model (confirm.py)
        if clock is not None:
            clock.begin(step)


def _writer_for(run, model_path, options, verdict, clock, max_calls: int, earlier: int) -> _BestWriter:
    """What writes minimal.onnx and summary.json after every accepted step."""
    writer = _BestWriter(run.out_dir, model_path, run.user_target, options, len(run.model.graph.node), clock.started, max_calls,
                         earlier_calls=earlier, file_nodes=run.prepared.file_nodes, warnings=verdict.warnings,
                         given_nodes=count_nodes(run.given.graph) if run.levels else None)
    run.prepared.notes.extend(f"warning: {w}" for w in verdict.warnings)  # a degenerate reference
    writer.samples = samples_summary(run.prepared)
    writer.clock = clock
    return writer
