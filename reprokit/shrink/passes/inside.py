"""inside: reduce the nodes inside the If branches the result still holds.

When the fault needs its control flow (an engine that fails only on what an If hides from it),
the top-level passes keep the If whole, with every node of its branches. This pass numbers every
node of the current best's model, those inside If branches (nested ones too) included, keeps one
output's cone (through an If only the branch outputs it needs), and runs ddmin over all of them (``reprokit/branchcut.py`` builds each candidate): a removed
node's tensor is fed with the activation captured on the opened model, never made up; outputs
nothing reads go from the If and both branches alike. Each candidate is judged by the same oracle
and the same decision (engine/bug.py, causal test included: ``Reducer.within``) and counts against
the same call budget; an accepted one becomes the model the
run finishes with (its inputs fed like the model's own). Loop and Scan bodies stay whole.
"""

from __future__ import annotations

import hashlib
import os

from reprokit.engine.activations import capture_opened as capture
from reprokit.graph.branchcut import Layered, Sites
from reprokit.graph.index import GraphIndex, count_nodes
from reprokit.graph.io import save_model
from reprokit.graph.model import mark_outputs
from reprokit.shrink.passes import ddmin
from reprokit.shrink.space import CandidateSpace


def holds_if(reducer) -> bool:
    """Does the current best hold an If with nodes in its branches?"""
    return any(reducer.model.graph.node[i].op_type == "If" for i in reducer.best) or reducer.space.wrap is not None


def run(reducer) -> bool:
    """Reduce inside the kept If branches; the result replaces the reducer's model. False when
    there is nothing inside to reduce (the caller runs the top-level ddmin instead)."""
    if not reducer.reach_inside:
        return False

    best = reducer.extraction(reducer.best)
    model, feeds = best.model, best.feeds
    if not any(n.op_type == "If" for n in model.graph.node) or count_nodes(model.graph) == len(model.graph.node):
        return False
    digest = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]
    own = capture(model, feeds, _reference_runner(reducer, feeds), os.path.join(reducer.workdir, f"inside-{digest}"),
                  reducer.pack_bytes)
    store = Layered(own, reducer.store)
    sites = Sites(model, store, feeds)
    if not sites.inside:
        return False
    # the same decision as the run's (causal test included): the space says how sites become
    # candidates, and the causal test injects their outputs, top-level tensors, by name
    space = CandidateSpace(scope=f"inside:{digest}:", build=lambda nodes, check: sites.extraction(nodes, check),
                           refuse=sites.refused, top_level=False)
    inner = reducer.within(space, model, GraphIndex.build(model), store, feeds, frozenset(range(len(sites.sites))))
    if reducer.budget is not None:
        inner.budget = max(0, reducer.budget - reducer.spent)
    inner.on_accept = lambda r, step: _adopt(reducer, r, sites.extraction(r.best), store)
    reducer.event(f"inside: {sites.inside} of the {len(sites.sites)} nodes sit inside If branches")
    inner.begin("inside")
    reducer.one_minimal = False
    try:
        _cones(inner, sites, [o.name for o in model.graph.output])
        ddmin.run(inner)
    finally:
        reducer.stats["inside"] = inner.stats["inside"]
        reducer.spent += inner.spent
        for label, count in inner.findings.items():
            reducer.findings[label] = reducer.findings.get(label, 0) + count
        reducer.contradictions += inner.contradictions
        for decision, count in inner.judged_by.items():
            reducer.judged_by[decision] = reducer.judged_by.get(decision, 0) + count
    reducer.one_minimal = inner.one_minimal
    return True


def _cones(inner, sites, outputs: list[str]) -> None:
    """One output's cone across the branches (the If outputs it does not need go, with what only
    they read): the smallest that still shows the signature, before the chunk deletions."""
    cones = sorted({sites.cone(name) for name in outputs}, key=lambda c: (len(c), sorted(c)))
    cones = [c for c in cones if c and inner.smaller(c)]
    hit = inner.first_interesting(cones) if cones else None
    if hit is not None:
        inner.accept(cones[hit], "one output's cone, inside the branches too")


def _reference_runner(reducer, feeds):
    """The reference on a model reprokit built (the opened best), guarded: a failure there is
    reprokit's, said as such, not the user's model."""
    def run_reference(model, names):
        path = save_model(mark_outputs(model, list(names)), os.path.join(reducer.workdir, "inside_capture.onnx"))
        call = lambda: reducer.oracle.run_reference(path, feeds, list(names))  # noqa: E731
        return reducer.guard("reducing inside If branches", call) if reducer.guard else call()

    return run_reference


def _adopt(reducer, inner, sub, store) -> None:
    """The accepted candidate becomes the model the run works on: every node of it kept, its
    inputs (cut tensors included) fed like the model's own."""
    # the reference never ran on the candidates (judged against captured outputs): it runs the
    # adopted model once, so a rewrite it refuses is said to be reprokit's, not left to the pack
    _reference_runner(reducer, sub.feeds)(sub.model, list(sub.outputs)).discard()
    reducer.model, reducer.index = sub.model, GraphIndex.build(sub.model)
    reducer.feeds, reducer.store = dict(sub.feeds), store
    reducer.space = CandidateSpace(scope=inner.space.scope + "adopted:", top_level=False)
    reducer.best = frozenset(range(len(sub.model.graph.node)))
    reducer.history = [reducer.best]
    reducer._readers, reducer._weights, reducer._feed_ok = None, None, {}
    if reducer.on_accept:
        reducer.on_accept(reducer, "inside")
