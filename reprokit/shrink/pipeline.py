"""The order of the passes over one current best, and what a search that finds no small
region says instead (attribution).

1. **named** (pass/fail signatures): the node the engine's message names, alone.
2. **survey**: every node alone (one packed call for numeric oracles, with the marked
   layerwise run riding along; group testing for pass/fail ones below ``conflict.HALVE_FROM``
   nodes — from there on the conflict search's halving finds a single as well, for fewer nodes).
3. **pairs** and **localize** (numeric): every producer→consumer pair alone rides in the
   survey's call while the pack limits allow (a pair that reproduces there is taken for no
   call); then regions around the anchor and the origins, one packed call (the pairs not judged
   yet ride in it) — for a mismatch only when some node diverges on its own (else nothing is
   "born" anywhere); then the pairs step, usually from answers already cached — the first round of a
   mismatch's drift window (step 4) rides in its packs while they have room.
4. A mismatch no region shows on its own is **accumulated** error: the run stops with each
   node's isolated error, the top contributors and the cumulative curve (``attribution``)
   instead of calling a large window minimal (``search_accumulated`` searches anyway).
5. **conflict** (nodes that fail only together, a fusion among them: ``passes/conflict.py``), then
   **window** (bisection of the end and the start) when it finds no set that fails alone,
   **branches** (one output's cone) and **ddmin** (chunk deletion down to single nodes; packed complements for numeric oracles) —
   ddmin's last sweep proves 1-minimality, usually from answers already cached.
   **inside** takes ddmin's place when the best still holds If nodes with nodes in their
   branches: ddmin over every node, those inside the branches included (``passes/inside.py``);
   the reduced model becomes the run's model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reprokit.engine.oracle import Kind
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import save_model
from reprokit.graph.model import mark_outputs
from reprokit.shrink.passes import (
    branches,
    conflict,
    ddmin,
    drift_window,
    inside,
    localize,
    named,
    survey,
    window,
)
from reprokit.shrink.precision import ranking
from reprokit.shrink.reducer import BudgetExhausted, Journal, Reducer
from reprokit.standalone.compare import jsonable

NUMERIC = (Kind.NONFINITE, Kind.MISMATCH)
GROUPED = (Kind.BUILD_ERROR, Kind.CRASH)  # timeouts are not packed: a bigger model is slower
CONFLICT_UP_TO = 4096  # nodes the conflict-set search takes on; larger bests are windowed first


@dataclass(frozen=True)
class Plan:
    localize: bool = True  # named, survey and localize before the search
    pack: bool = True  # several candidates per engine call where the oracle allows
    search_accumulated: bool = False  # search on when no small region shows a mismatch alone


def packing_for(kind: Kind, pack: bool) -> str | None:
    if not pack:
        return None
    if kind in NUMERIC:
        return "numeric"
    return "group" if kind in GROUPED else None


def reduce(reducer, plan: Plan, message: str = "") -> str:
    """Run the passes; returns "reduced", "accumulated" or "budget"."""
    numeric = reducer.signature.kind in NUMERIC
    try:
        found = False
        if plan.localize:
            if not numeric:
                reducer.begin("named")
                found = named.run(reducer, message)
            # one candidate per call (a timeout, or --one-by-one with a pass/fail oracle), every
            # node alone costs a call each: n calls where the conflict search needs k·log n; and
            # where the inputs or outputs are kept (polygraphy's --no-reduce-*) a node alone is
            # mostly no candidate at all: the conflict search's windows are what is left to try
            kept = reducer.keep_inputs or reducer.keep_outputs
            # from conflict.HALVE_FROM nodes on, the conflict search's halving finds a single alone
            # too, building windows where the survey's packs build every node: the survey's two
            # calls and n nodes would only say "no single" to a pair (issue 39: nodes built)
            halved = len(reducer.best) >= conflict.HALVE_FROM and len(reducer.best) <= CONFLICT_UP_TO
            if not found and (numeric or (reducer.packing is not None and not kept and not halved)):
                reducer.begin("survey")
                found = survey.run(reducer, layerwise=numeric)
            # pairs ride in the survey's call while the pack has room: one that reproduces is
            # taken at once, for no call (a pair is the smallest region localize could grow);
            # the rest ride in localize's call, so the pairs step finds them judged
            if not found and numeric:
                reducer.begin("pairs")
                # packed by build cost no pair rode in the survey: the pairs are asked here, likeliest
                # first in chunks that stop at the first hit, so the answer is the one packing by
                # count takes from its riders (a pair before any region localize grows) — unless the
                # survey stopped at the births of a NaN/Inf (survey._by_cost): localize starts there
                found = survey.pairs(reducer, known_only=reducer.build_cost is None or not survey.complete(reducer))
            if not found and numeric:
                survey.anchor_now(reducer)  # packed by build cost the marked copy waits for this
            if not found and numeric and _born_somewhere(reducer):
                reducer.begin("localize")
                survey.ride_pairs(reducer)
                found = localize.run(reducer)
            if not found and numeric:
                reducer.begin("pairs")
                if reducer.signature.kind is Kind.MISMATCH and not plan.search_accumulated:
                    # no node shows the mismatch alone: an accumulated verdict is likely, and the
                    # drift window's first windows ride in the pairs' packs while they have room
                    drift_window.ride(reducer)
                found = survey.pairs(reducer)
                reducer.take_riders()  # those that found no room: the drift window asks them itself
            if not found and reducer.signature.kind is Kind.MISMATCH and not plan.search_accumulated:
                return "accumulated"
        # the conflict search where the survey said no single node shows it alone; a search-only
        # run (--no-localize) bisects a window as polygraphy does
        if not found and plan.localize and len(reducer.best) <= CONFLICT_UP_TO:
            reducer.begin("conflict")
            found = conflict.run(reducer)
        if not found:
            reducer.begin("window")
            window.run(reducer)
        reducer.begin("branches")
        branches.run(reducer)
        if reducer.reach_inside and inside.holds_if(reducer):
            # ddmin over every node, those inside the kept If branches included: the top-level
            # ddmin's candidates are among its own
            reducer.begin("inside")
            if inside.run(reducer):
                return "reduced"
        reducer.begin("ddmin")
        ddmin.run(reducer)
    except BudgetExhausted:
        return "budget"
    return "reduced"


def _born_somewhere(reducer) -> bool:
    """Is there a place where the divergence is born, for regions to grow from? A NaN/Inf always
    is; a mismatch only when some node diverges on its own (an overflow, a cancellation) —
    otherwise it is every node's small error adding up, and no region is the bug."""
    if reducer.signature.kind is Kind.NONFINITE:
        return True
    return any(_diverges_alone(o) for o in reducer.isolated.values())


def _diverges_alone(outcome) -> bool:
    return outcome.kind not in ("agree", "invalid", "no-outputs", "empty", "no-anchor")


def attribution(reducer, label, limit: int = 10) -> dict:
    """Where an accumulated error comes from: each node's own error fed with reference inputs
    (the isolated survey), the largest contributors, the marked run's error curve along the
    graph, and the nodes to keep in fp32 (``fp32-nodes=``: untested as a set)."""
    isolated = [(i, o) for i, o in reducer.isolated.items() if o.error is not None]
    isolated.sort(key=lambda item: -_finite(item[1].error))
    top = [{"node": label(i), "op": reducer.model.graph.node[i].op_type, "error": jsonable(o.error),
            "kind": o.kind} for i, o in isolated[:limit]]
    largest = _finite(isolated[0][1].error) if isolated else 0.0
    keep = [label(i) for i, o in isolated[:limit] if largest > 0 and _finite(o.error) >= 0.1 * largest]
    curve = []
    report = reducer.layerwise_report
    if report is not None:
        rows = report.rows
        step = max(1, len(rows) // 200)
        curve = [{"index": r.index, "tensor": r.tensor, "node": r.node, "error": jsonable(r.error.error)}
                 for r in rows[::step]]
    return {
        "nodes_judged_alone": len(isolated),
        "diverging_alone": sum(1 for _, o in isolated if o.kind != "agree"),
        "tolerance": reducer.oracle.criterion.tolerance,
        # a quantized model: nodes were judged with their Q/DQ units, in quantization steps
        "quantized": reducer.oracle.quant.describe() if getattr(reducer.oracle, "quant", None) else "",
        "top": top,
        "cumulative": curve,
        "fp32_nodes": ";".join(keep),
    }


def _finite(value) -> float:
    value = float(value)
    return value if value == value else float("inf")




def _capture(model, feeds: dict, oracle, names: list[str], workdir: str) -> dict:
    """The reference's values of ``names`` (tensors of any dtype), copied out of the worker's files."""
    path = save_model(mark_outputs(model, names), os.path.join(workdir, "inputs-captured.onnx"))
    result = oracle.run_reference(path, feeds, names)
    try:
        return {n: np.array(v) for n, v in result.outputs.items() if n in names}
    finally:
        result.discard()


class _Captured:
    """A capture's outputs (name → array, memory-mapped) seen as an activation store."""

    def __init__(self, outputs):
        self.outputs = outputs

    def __contains__(self, name: str) -> bool:
        return name in self.outputs

    def get(self, name: str):
        import numpy as np

        return np.asarray(self.outputs[name])

    def info(self, name: str):
        value = self.get(name)
        return tuple(value.shape), value.dtype


def isolated_attribution(model, activations: dict, feeds: dict, oracle, signature, workdir: str,
                         label) -> dict:
    """Every node alone, fed with the captured activations, in packed calls (one for most models):
    the same attribution shrink writes for an accumulated error, for ``audit`` and ``check
    --layerwise``. Every node is judged, as shrink's survey judges it: a Constant (no inputs) by
    its own output, a node that reads a tensor the capture lacks (an int32 accumulator a Cast
    turns into floats, an index) fed with that tensor in its own dtype, captured by one more
    reference run (never a target call). Only a node the reference gives no value of is left out."""
    import os

    os.makedirs(workdir, exist_ok=True)
    index = GraphIndex.build(model)
    known = set(activations) | set(index.initializers) | set(feeds) | set(index.constants)
    missing = sorted({t for inputs in index.node_inputs for t in inputs if t not in known and t in index.producer})
    if missing:
        activations = {**activations, **_capture(model, feeds, oracle, missing, workdir)}
        known |= set(activations)
    nodes = [i for i in range(len(model.graph.node))
             if all(t in known for t in index.node_inputs[i])
             and (index.node_inputs[i] or any(t in activations for t in index.node_outputs[i]))]
    reducer = Reducer(model, index, _Captured(activations), feeds, oracle, signature, workdir=workdir,
                      journal=Journal(None), best=frozenset(nodes))
    reducer.packing = "numeric"
    reducer.isolated = dict(zip(nodes, reducer.verdicts([frozenset([i]) for i in nodes])))
    found = attribution(reducer, label)
    found["calls"] = reducer.spent
    found["ranking"] = ranking(reducer.isolated, label)  # what the precision workaround searches over
    # where a divergence is born: a node whose own numbers diverge — not one the engine refused to
    # run alone (OpenVINO on a lone Mul of silero-vad: a build error, said as "starts at /Mul")
    found["diverging_nodes"] = [label(i) for i in sorted(reducer.isolated)
                                if reducer.isolated[i].kind in ("mismatch", "nonfinite")]
    return found
