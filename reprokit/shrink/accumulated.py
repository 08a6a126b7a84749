"""The end of a run whose mismatch no small region shows on its own (accumulated error): the
attribution, a tested precision workaround (:mod:`reprokit.shrink.precision`) and the smallest
window that still drifts (:mod:`reprokit.shrink.passes.drift_window`), judged alone and written
as window.onnx. No model is called minimal here.
"""

from __future__ import annotations

import os

import numpy as np

from reprokit.engine.layerwise import divergence_start
from reprokit.engine.session import make_oracle
from reprokit.graph.io import file_outline, save_model, weight_bytes
from reprokit.graph.model import node_label, node_labels
from reprokit.shrink import pipeline, precision
from reprokit.shrink.budget import SHARED_FEEDS_RUNS
from reprokit.shrink.evaluator import judge_member
from reprokit.shrink.fp32_nodes import fp32_nodes_support
from reprokit.shrink.members import Member
from reprokit.shrink.passes import drift_window
from reprokit.shrink.reducer import BudgetExhausted
from reprokit.shrink.runstate import _atomic_json


def finish_accumulated(run, reducer, writer, verdict) -> tuple[str, str]:
    """No small region shows the mismatch on its own: say so, with the attribution and a tested
    workaround (the fewest top-ranked nodes that, kept in fp32, bring the whole model within
    tolerance, run as printed) and the drift window; write no model called minimal. Returns
    (the note, the window's path or "")."""
    reducer.begin("attribution")
    label = lambda i: node_label(run.model.graph.node[i], i)  # noqa: E731
    found = pipeline.attribution(reducer, label)
    # the survey's own words, as check --layerwise and audit say them: a node whose isolated error
    # exceeds the tolerance diverges on its own, even where it is too mild (or not causal) to be
    # the original's bug — never "no node diverges on its own" beside a table of nodes that do
    alone = [label(i) for i in sorted(reducer.isolated) if reducer.isolated[i].kind in ("mismatch", "nonfinite")]
    found["divergence_start"] = divergence_start(reducer.layerwise_report, alone)
    found["workaround"] = _tested_workaround(run, reducer, label)
    reducer.begin("drift window")
    window = _drift_window(run, reducer, label)
    tested = found["workaround"]
    if tested.get("agrees"):
        advice = (f"keeping {tested['size']} node{'s' if tested['size'] > 1 else ''} in fp32 brings the whole model "
                  f"within tolerance (run as printed: {tested['setting']} → {tested['verdict']}, error "
                  f"{_num(tested['error'])})")
        if tested.get("prefix_fails", 0) and tested["prefix_fails"] < tested["size"] - 1:
            # the search stopped at a bracket (precision.close_enough): say how close it is
            advice += f"; a ranked prefix of {tested['prefix_fails']} nodes does not"
    elif tested.get("reason"):
        advice = f"no per-node precision to suggest: {tested['reason']}"
    else:
        advice = tested.get("note") or "no set of ranked nodes kept in fp32 brings the model within tolerance"
    # regions grow only from a node that diverges alone (pipeline._born_somewhere): the note
    # claims no region only where localize judged some
    judged = "no single node, pair or region around the first divergence" if "localize" in reducer.stats else \
        "no single node or producer→consumer pair (no node diverges alone, so no region was grown from one)"
    found["regions_judged"] = "localize" in reducer.stats
    note = (f"accumulated error: {judged} shows the "
            f"mismatch on its own ({found['diverging_alone']} of {found['nodes_judged_alone']} nodes exceed the "
            "tolerance alone); ")
    if reducer.exact_pairs:  # not built, and said so: the claim covers them by the survey's evidence
        found["exact_pairs_not_built"] = reducer.exact_pairs
        note += (f"{reducer.exact_pairs} pairs were not built: their producer computed the reference's values "
                 "exactly alone, so each is its consumer alone, judged in the survey; ")
    note += "see `attribution` for the layers that contribute most; " + advice
    if window is not None:
        anchor = window["anchor"]
        where = (f": nodes {anchor['first']}–{anchor['last']} of the file's {anchor['of']}"
                 if anchor.get("first") is not None and anchor.get("last") is not None else "")
        note += (f"; the smallest window that still drifts on its own: {window['nodes']} of {window['of']} nodes "
                 f"({window['first']} … {window['last']}{where}, error {_num(window['error'])}), written as "
                 "window.onnx")
    if reducer.stopped:
        note += ("; stopped at the call budget before the drift window was found: `--resume` with a larger "
                 "--max-calls (0: no limit) continues")
    run.event(note)
    writer.write_summary(reducer, "accumulated", final_verdict=verdict, note=note, attribution=found)
    writer.summary["window"] = window
    _atomic_json(os.path.join(run.out_dir, "summary.json"), writer.summary)
    return note, window["path"] if window else ""


def _drift_window(run, reducer, label) -> dict | None:
    """The smallest topological window that drifts on its own (passes/drift_window.py), judged
    alone, written as window.onnx with its inputs (captured activations) and reference outputs."""
    try:
        found = drift_window.run(reducer)
    except BudgetExhausted:
        reducer.stopped = True  # the summary says so, and --resume continues (runstate.finished_run)
        return None
    if found is None or len(found.nodes) >= found.of:
        return None
    window = reducer.extraction(found.nodes)
    known = reducer.cached(found.nodes)
    if reducer.share_feeds and known is not None and known.interesting and known.packed:
        # an engine that runs every node as written (the emulator, onnxruntime on the CPU)
        # computes a packed member exactly as the member alone (its own copy of each node, the
        # same feeds, nothing fused or merged across members): its packed run is its run alone
        judged, error, said = "packed", known.error, known.kind + (f" ({known.detail})" if known.detail else "")
    else:
        # judged alone as any candidate is (the one predicate, the oracle's cache): a window the
        # search already judged alone (a pack of one) is not built again
        try:
            outcome, verdict = judge_member(reducer, Member(found.nodes, window))
        except BudgetExhausted:
            reducer.stopped = True
            return None  # the budget that stopped the search stops its last call too
        if not outcome.interesting:
            return None  # drifted inside a pack only: no window is offered
        worst = verdict.worst()
        judged, error, said = "alone", float(worst.error) if worst else None, verdict.signature.describe()
    path = os.path.join(run.out_dir, "window.onnx")
    with reducer.tally.timing("write"):  # the window's model and arrays: files written, as a candidate's are
        save_model(window.model, path, base_dir=run.prepared.base_dir, self_contained=True)
        reference = {n: reducer.store.get(n) for n in window.outputs if n in reducer.store}
        np.savez(os.path.join(run.out_dir, "window_inputs.npz"), **window.feeds)
        np.savez(os.path.join(run.out_dir, "window_reference.npz"), **reference)
    order = reducer.ordered(found.nodes)
    first, last = label(order[0]), label(order[-1])
    return {"path": path, "inputs": os.path.join(run.out_dir, "window_inputs.npz"), "nodes": len(found.nodes),
            "of": found.of, "share": round(len(found.nodes) / found.of, 4), "start": found.start,
            "first": first, "last": last, "anchor": file_anchor(run, first, last), "error": error,
            "tolerance": reducer.oracle.criterion.tolerance, "verdict": said, "judged": judged,
            "outputs": list(window.outputs),
            # pack judges the window's outputs in the steps this run judged them in (a quantized model)
            "quant_steps": run.oracle.quant.recorded(window.outputs) if run.oracle.quant is not None else None}


def file_anchor(run, first: str, last: str) -> dict:
    """Where the window lies in the user's own file: its first and last node's 0-based positions
    among the file's top-level nodes (``node_label``: names, ``OP_INDEX`` for unnamed ones). Unlike
    ``start`` and ``of`` (positions in the order the search cut, after folding and --input-shapes
    removed nodes), this anchor does not move with --input-shapes or folding: the file is the
    same file. None where a node is not in the file (an opened If's inlined nodes)."""
    given = file_outline(run.options.reference_model or run.model_path).nodes
    where = {node_label(node, i): i for i, node in enumerate(given)}
    return {"of": len(given), "first": where.get(first), "last": where.get(last),
            "order": "the user's file's top-level node order"}


def _tested_workaround(run, reducer, label) -> dict:
    """The precision workaround search (shrink/precision.py) on the user's model, fed with the
    run's feeds and judged against the captured reference outputs; its trials are journaled with
    the run's candidates, so a resumed run reads them back instead of calling the target again."""
    supported, why = fp32_nodes_support(run.user_target)
    if not supported:
        return {"agrees": False, "reason": why, "calls": 0}
    labels = node_labels(run.prepared.model)
    ranked = [n for n in precision.ranking(reducer.isolated, label) if n in labels]
    reference = {name: reducer.store.get(name) for name in reducer.index.graph_outputs if name in reducer.store}

    def oracle_for(spec: str):
        oracle = make_oracle(spec, run.options, os.path.join(run.state_dir, "precision"))
        oracle.stats = run.oracle.stats  # the summary's call count is every target call of the run
        return oracle

    def charge() -> None:  # every target call counts against --max-calls, the search's too
        reducer.charge()
        reducer.spent += 1  # counted here: the search calls the oracle, not the evaluator

    search = precision.Search(run.prepared.model, run.prepared.path, run.feeds, reference, run.user_target,
                              oracle_for, os.path.join(run.models_dir, "precision"), weights_dir=run.prepared.base_dir,
                              width=_copies_that_fit(run, reducer), on_event=run.event, journal=reducer.journal,
                              cancelled=lambda: reducer.cancelled, charge=charge,  # --resume asks none again
                              pack=_packs_trials(reducer))
    try:
        return precision.find_workaround(search, ranked, **_bisection_bounds(reducer)).to_json()
    except BudgetExhausted:
        reducer.stopped = True
        return {"agrees": False, "calls": search.calls, "cached": search.cached,
                "trials": [t.to_json() for t in search.trials],
                "note": f"the call budget ran out during the precision search ({search.calls} calls made); "
                        "`--resume` with a larger --max-calls continues it"}
    finally:
        stats = reducer.stats["attribution"]
        stats.calls += search.calls
        stats.add_built(search.built)
        stats.built_by["fp32-nodes trials"] = stats.built_by.get("fp32-nodes trials", 0) + search.built.nodes_built


def _packs_trials(reducer) -> bool:
    """Packed by build cost (--pack-by), one whole model per call (bisection): a pack of copies
    builds every copy, and the copies, not the calls, are the cost (PP-OCRv4 det under
    emulate:bf16: 14 copies, 4,620 nodes built, where bisection answers in two builds); packs of
    copies only where the budget leaves fewer than two calls. By count: packs of copies."""
    if reducer.build_cost is None:
        return True
    left = reducer.calls_left()
    return left is not None and left < 2


def _bisection_bounds(reducer) -> dict:
    """Packed by build cost: the bisection's call cap (half the calls the budget leaves, at least
    two: the drift window comes after it) and a bracket of a quarter of the agreeing set (each
    probe builds the whole model; the answer says its bracket). By count: no cap, a tenth."""
    if reducer.build_cost is None:
        return {}
    left = reducer.calls_left()
    return {"calls": None if left is None else max(2, left // 2), "slack": 4}


def _copies_that_fit(run, reducer) -> int:
    """Whole-model copies one packed precision call may hold under the run's pack memory bound
    (``Reducer.pack_bytes``, twice a marked run's data; an engine holds about twice a pack's data).
    A copy counts as its weights, its feeds and half the model's captured activations: measured
    on the emulator, PP-OCRv4 det at 320x320 with 16 copies peaked at 1,432 MiB, about 74 MiB a
    copy for 165 MiB of activations. Small models keep the full width."""
    copy = (weight_bytes(run.prepared.model) + sum(getattr(v, "nbytes", 0) for v in run.feeds.values())
            + reducer.store.nbytes() // 2)
    # Where packs share feeds their bound is SHARED_FEEDS_RUNS marked runs, not two: whole-model
    # copies gain nothing from it (they share their inputs anyway), so they keep the width of two.
    bound = int(reducer.pack_bytes * 2 / SHARED_FEEDS_RUNS) if reducer.share_feeds else reducer.pack_bytes
    return max(2, min(precision.PACK_WIDTH, 2 * bound // max(1, copy)))


def _num(value) -> str:
    return value if isinstance(value, str) or value is None else f"{value:.3g}"
