"""Which model a shrink run reduces when the model has control flow: opened level by level (If
nodes inlined, small Loops unrolled as the feeds run them), the deepest opening that still shows
the original's signature, or every candidate put back inside an If, or the model as given.
Also: models reprokit builds and the reference refuses are reprokit's fault, said as such.
"""

from __future__ import annotations

import os

from reprokit.engine.bug import shows_bug
from reprokit.errors import ExitCode, ReferenceFailure, ReprokitError
from reprokit.graph.controlflow import (
    decisions,
    has_control_flow,
    if_wrapper,
    open_control_flow,
    open_node,
    wrap_in_if,
)
from reprokit.graph.extract import extract
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import save_model
from reprokit.graph.model import mark_outputs


def open_levels(model, oracle, feeds, models_dir, event, given_path: str) -> list:
    """The model opened level by level (If nodes inlined, small Loops unrolled as these feeds run
    them; reference runs decide): [(model, notes)], deepest last; [] without control flow."""
    if not has_control_flow(model):
        return []
    event("opening control flow (If, Loop) as these feeds run it")

    def values(current, names):
        path = save_model(mark_outputs(current, names), os.path.join(models_dir, "control.onnx"))
        result = reprokit_built("opening control flow", lambda: oracle.run_reference(path, feeds, names),
                                oracle, given_path, feeds)
        try:
            return dict(result.outputs)
        finally:
            result.discard()

    return open_control_flow(model, values)


def reprokit_built(step: str, run_reference, oracle, given_path: str, feeds: dict):
    """``run_reference()`` on a model reprokit built for ``step``. When the reference fails on it
    but runs the model as given, the fault is reprokit's rewrite, not the user's model: an
    internal error that names the step (one more reference run, only then)."""
    try:
        return run_reference()
    except ReferenceFailure as exc:
        try:
            oracle.run_reference(given_path, feeds).discard()
        except ReferenceFailure:
            raise exc from None  # the model as given fails too: the user's model it is
        raise ReprokitError(
            f"internal error: the model reprokit built for {step} fails in the reference ({exc}), "
            "while the model as given runs", exit_code=ExitCode.INTERNAL,
            hint="a reprokit bug, not your model: please report it with the output of --debug") from exc


MAX_SINGLE_OPENINGS = 12  # target calls spent opening If/Loop nodes one at a time


def _open_one_by_one(run, store, shows) -> None:
    """Past the deepest level that keeps the divergence, open the still-closed If/Loop nodes one
    at a time, keeping each opening that still shows it (the If an engine needs stays closed,
    the others open): at most MAX_SINGLE_OPENINGS target calls."""
    import onnx

    current, refused, calls, opened = run.model, set(), 0, []
    while calls < MAX_SINGLE_OPENINGS:
        for node_index, tensors in decisions(current):
            node = current.graph.node[node_index]
            key = (node.op_type, node.name, tuple(node.output))
            if key in refused:
                continue
            candidate = onnx.ModelProto()
            candidate.CopyFrom(current)
            note = open_node(candidate, node_index, {t: store.get(t) for t in tensors if t in store}, tensors)
            refused.add(key)
            if note is None or not all(o in store for n in candidate.graph.node for o in n.output if o):
                continue  # a name the capture does not hold: leave this one closed
            calls += 1
            if shows(candidate, f"opened_single_{calls}.onnx"):
                current = candidate
                opened.append(note)
                break  # positions moved: look again
            if calls >= MAX_SINGLE_OPENINGS:
                break
        else:
            break
    if opened:
        run.model, run.index = current, GraphIndex.build(current)
        run.prepared.notes.append("then opened one by one: " + "; ".join(opened))


def keep_opening(run, store, graph_outputs: dict, verdict):
    """Which model the reduction works on, when the model has control flow: the deepest opening
    that still shows the original's signature (the fully opened one first, then a binary search
    over the levels: an engine that fails because of a nested If keeps that If); failing that,
    for a network that sits in one top-level If, every candidate put back inside an If (an engine
    that fails only inside one); else the model as given. Sets run.model/run.index, returns the
    wrap for the reducer (or None). About log2(levels) + 2 target calls, only for such models."""
    if not run.levels:
        return None

    def shows(model, name, feeds=None) -> bool:
        path = save_model(model, os.path.join(run.models_dir, name), base_dir=run.prepared.base_dir)
        seen = run.oracle.judge(path, feeds if feeds is not None else run.feeds, reference_outputs=graph_outputs)
        return shows_bug(verdict.signature, seen)

    def use(level: int, note: str):
        model, notes = run.levels[level]
        if model is not run.model:  # the run opened at the deepest level: its index is built
            run.model, run.index = model, GraphIndex.build(model)
        run.prepared.notes.append(note + "; ".join(notes))

    run.event(f"control flow: {len(run.levels)} level(s) to open; finding the deepest that still diverges")
    deepest = len(run.levels) - 1
    if shows(run.levels[deepest][0], "opened.onnx"):
        use(deepest, "control flow opened for these feeds: ")
        return None
    low, high = -1, deepest  # level low shows it (-1: the model as given), level high does not
    while high - low > 1:
        middle = (low + high) // 2
        if shows(run.levels[middle][0], f"opened_{middle + 1}.onnx"):
            low = middle
        else:
            high = middle
    if low >= 0:
        use(low, f"control flow opened {low + 1} of {deepest + 1} levels (deeper, the divergence goes): ")
        _open_one_by_one(run, store, shows)
        return None
    cond = if_wrapper(run.given)
    if cond is not None and cond in store:
        value = store.get(cond)
        # run.model is still the deepest opening, as the run opened it: every node of it, in an If
        whole = wrap_in_if(extract(run.model, run.index, range(len(run.model.graph.node)), store, feeds=run.feeds),
                           cond, value)
        if shows(whole.model, "opened_in_if.onnx", whole.feeds):
            run.prepared.notes.append("the divergence needs its If: the reduction works on the nodes inside, each "
                                      "candidate kept inside an If (" + "; ".join(run.levels[deepest][1]) + ")")
            return lambda sub: wrap_in_if(sub, cond, value)
    run.prepared.notes.append("the divergence needs the control flow as it is: reduced at the top level, "
                              "If/Loop nodes kept (then the nodes inside the kept If branches: the inside step)")
    run.model, run.index = run.given, GraphIndex.build(run.given)
    return None
