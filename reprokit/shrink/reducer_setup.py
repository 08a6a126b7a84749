"""The run's Reducer, made and held: ``make_reducer`` builds it over the run's model (every node its
first best; how candidates are packed, the pack limits, the candidate space of an opened model,
the inputs/outputs held fixed) and ``hold_to`` says what "shows the original bug" is held to —
the causal test or the signature, the severity floor (``severity_floor``), the message of a build
error or crash — once the original's verdict is known.

Must not judge a candidate or make an engine call: the steps (``steps.py``) do, through the
Reducer.
"""

from __future__ import annotations

from reprokit.engine.bug import NUMERIC, CausalTest
from reprokit.engine.oracle import Kind, normalize_message
from reprokit.shrink import buildcost, pipeline
from reprokit.shrink.opening import reprokit_built
from reprokit.shrink.reducer import PassStats, Reducer
from reprokit.shrink.space import CandidateSpace
from reprokit.spec import parse_target
from reprokit.standalone.compare import Metric

__all__ = ["confirm_stats", "hold_to", "make_reducer", "severity_floor"]


def make_reducer(
    run,
    store,
    verdict,
    wrap,
    clock,
    limits,
    *,
    jobs: int,
    pack_candidates: bool,
    share_feeds: bool,
    keep_inputs: bool,
    keep_outputs: bool,
    accept_milder: bool,
    pending: bool = False,
) -> Reducer:
    """The Reducer over the run's model, every node its first best: how candidates are packed,
    what "shows the original bug" is held to (``hold_to``; a folded confirmation holds it when
    the original's verdict comes: ``pending``), and the limits of a pack."""
    original_nodes = len(run.model.graph.node)
    reducer = Reducer(
        run.model,
        run.index,
        store,
        run.feeds,
        run.oracle,
        verdict.signature,
        workdir=run.models_dir,
        journal=run.journal,
        jobs=jobs,
        on_event=run.event,
        best=frozenset(range(original_nodes)),
    )
    reducer.packing = pipeline.packing_for(verdict.signature.kind, pack_candidates)
    if wrap is not None:  # the opening's space: every candidate put back inside an If
        reducer.space = CandidateSpace(wrap=wrap)
    reducer.keep_inputs, reducer.keep_outputs = keep_inputs, keep_outputs
    # the inside step replaces the run's model: only where nothing else reads the old numbering
    reducer.reach_inside = not (keep_inputs or keep_outputs or run.prepared.sample_verdicts)
    reducer.clock = clock
    reducer.guard = lambda step, call: reprokit_built(
        step, call, run.oracle, run.prepared.path, run.feeds
    )
    reducer.names_select_nodes = parse_target(run.target).has("fp32-nodes")
    reducer.share_feeds = share_feeds
    reducer.stats["confirm"] = confirm_stats(
        run.oracle, original_nodes, buildcost.heavy_layers(run.model)
    )
    if not pending:
        hold_to(run, reducer, verdict, accept_milder)
    reducer.pack_bytes = limits.pack_memory_bytes
    reducer.pack_nodes = max(512, 6 * original_nodes)
    reducer.build_cost = buildcost.policy(limits.pack_by, run.target)
    return reducer


def hold_to(run, reducer, verdict, accept_milder: bool) -> None:
    """What "shows the original bug" is held to: the causal test, or the signature; the
    severity floor; the message of a build error or crash."""
    signature = reducer.signature = verdict.signature
    if accept_milder and signature.kind is Kind.MISMATCH:
        reducer.no_slippage.update(
            test="signature",
            why="--accept-milder: a milder mismatch is accepted, and a "
            "milder one need not cause the original's",
        )
    elif signature.kind in NUMERIC:
        reducer.causal = CausalTest(
            run.oracle,
            run.model,
            run.index,
            reducer.store,
            run.feeds,
            signature,
            run.oracle.criterion,
            run.models_dir,
        )
    else:
        reducer.no_slippage.update(
            test="signature",
            why=f"a {signature.kind.value} has no output values to "
            "inject: the same failure class (and message) is what is held",
        )
    if not accept_milder:
        reducer.severity = severity_floor(verdict)
    if signature.kind in (Kind.BUILD_ERROR, Kind.CRASH):
        reducer.message_key = normalize_message(verdict.message)


def severity_floor(verdict) -> float | None:
    """The error a mismatch candidate must reach: a tenth of the original's worst error, at least
    the tolerance and at most ten times it — so a 1.0 divergence never shrinks to a 0.0104 one
    (tolerance 0.01) a maintainer would dismiss, while a divergence near the tolerance keeps it."""
    if verdict.kind is not Kind.MISMATCH or verdict.criterion.metric is Metric.ALLCLOSE:
        return None
    tolerance = verdict.criterion.tolerance
    floats = [o.error for o in verdict.outputs if o.exceeds and not o.exact]
    if not floats:  # only exact outputs (ids, indices) differ: every differing element counts
        return None
    return max(tolerance, min(max(floats) / 10, 10 * tolerance))


def confirm_stats(oracle, nodes: int, heavy: int):
    stats = PassStats(calls=oracle.stats.target, seconds=oracle.stats.target_seconds)
    stats.note_built(nodes, heavy, calls=oracle.stats.target)
    return stats
