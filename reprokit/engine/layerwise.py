"""Layerwise comparison: every intermediate float tensor on reference and target, compared in
topological order, and the first places where the target starts to diverge.

Activations stay on disk (.npy, memory-mapped): the worker writes them, this module reads them
one tensor at a time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from reprokit.graph.io import save_model
from reprokit.graph.model import OBSERVE_KEY, float_tensor_names, mark_outputs
from reprokit.spec import marking_changes_engine
from reprokit.standalone.compare import OutputError, compare_arrays


@dataclass(frozen=True)
class TensorRow:
    index: int  # position in topological order
    tensor: str
    node: str
    op: str
    error: OutputError
    inputs_agree: bool  # all float inputs of the node agree (so the divergence starts here)
    inputs_finite: bool = True  # no float input of the node is NaN/Inf in the target where the reference is finite

    def to_json(self) -> dict:
        return {"index": self.index, "tensor": self.tensor, "node": self.node, "op": self.op,
                "inputs_agree": self.inputs_agree, **{k: v for k, v in self.error.to_json().items() if k != "name"}}


@dataclass
class LayerwiseReport:
    rows: list[TensorRow]  # every compared tensor, topological order
    marking_changes_engine: bool
    missing: list[str]  # tensors the target did not return (fused away)
    reference: dict | None = None  # the reference's tensors (memory-mapped), for an isolated run
    start: dict | None = None  # divergence_start(): where it starts, local or accumulated

    @property
    def diverging(self) -> list[TensorRow]:
        return [r for r in self.rows if r.error.exceeds or r.error.nonfinite_in_target_only]

    @property
    def first(self) -> list[TensorRow]:
        """Where divergence starts: first the tensors where NaN/Inf is born (the node's inputs are
        still finite, however far they drifted: a NaN is the kind users come with, and it is the
        node shrink and audit find), then diverging tensors whose node's inputs all still agree."""
        born = [r for r in self.rows if r.error.nonfinite_in_target_only and r.inputs_finite]
        seen = {r.tensor for r in born}
        return born + [r for r in self.diverging if r.inputs_agree and r.tensor not in seen]

    def to_json(self, limit: int = 20) -> dict:
        return {
            "compared": len(self.rows),
            "diverging": len(self.diverging),
            "first": [r.to_json() for r in self.first[:limit]],
            "missing_in_target": self.missing[:limit],
            "marking_changes_engine": self.marking_changes_engine,
            **({"start": self.start} if self.start is not None else {}),
        }


def float_node_outputs(model) -> list[tuple[str, str, str, list[str]]]:
    """(tensor, node name, op, node inputs) for every float node output, topological order."""
    floats = float_tensor_names(model)
    order = []
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        for tensor in node.output:
            if tensor and tensor in floats:
                order.append((tensor, name, node.op_type, [i for i in node.input if i]))
    return order


def compare_layerwise(model, reference, target, criterion, marking_changes_engine: bool) -> LayerwiseReport:
    """Compare tensor by tensor; ``reference``/``target`` map names to (memory-mapped) arrays."""
    floats = float_tensor_names(model)
    graph_inputs = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    rows: list[TensorRow] = []
    missing: list[str] = []
    agrees: dict[str, bool] = {}
    finite: dict[str, bool] = {}
    for index, (tensor, node, op, inputs) in enumerate(float_node_outputs(model)):
        if tensor not in target or tensor not in reference:
            missing.append(tensor)
            continue
        error = compare_arrays(tensor, reference[tensor], target[tensor], criterion, full=False)
        agrees[tensor] = not (error.exceeds or error.nonfinite_in_target_only)
        finite[tensor] = not error.nonfinite_in_target_only
        inputs_ok = all(agrees.get(i, i in graph_inputs or i not in floats) for i in inputs)
        inputs_finite = all(finite.get(i, True) for i in inputs)
        rows.append(TensorRow(index, tensor, node, op, error, inputs_ok, inputs_finite))
    return LayerwiseReport(rows, marking_changes_engine, missing)


def compare_marked_run(model, reference, result, oracle) -> LayerwiseReport:
    """The layerwise report of one target run with every float tensor marked (a worker
    result); a target that fails when tensors are marked gives an empty report saying so."""
    observed_by = str((result.meta or {}).get("observed_by") or "")
    # read as debug tensors (TensorRT >= 10), the marked tensors leave the engine as it was built
    marking = marking_changes_engine(oracle.target) and "debug tensors" not in observed_by.split(":")[0]
    if result.status != "ok":
        return LayerwiseReport([], marking, [f"target failed with tensors marked: {result.status}: {result.message[:200]}"])
    return compare_layerwise(model, reference, result.outputs, oracle.criterion, marking)


def run_layerwise(oracle, prepared, workdir: str) -> LayerwiseReport:
    """Mark every float node output, run reference and target, compare tensor by tensor."""
    os.makedirs(workdir, exist_ok=True)
    model = prepared.model
    names = [t for t, *_ in float_node_outputs(model)]
    marked = mark_outputs(model, names)
    # an engine with a way to read tensors without making them outputs (TensorRT >= 10's debug
    # tensors) uses it for the tensors this asks to observe (issue 36)
    marked.metadata_props.add(key=OBSERVE_KEY, value="layerwise")
    marked_path = save_model(marked, os.path.join(workdir, "marked.onnx"), base_dir=prepared.base_dir)
    reference = oracle.run_reference(marked_path, prepared.feeds.arrays, names)
    target = oracle.run_target(marked_path, prepared.feeds.arrays, names)
    report = compare_marked_run(model, reference.outputs, target, oracle)
    report.reference = reference.outputs
    return report


def divergence_start(report: LayerwiseReport | None, diverging_alone: list[str] | None) -> dict:
    """Where the divergence starts, one definition for check --layerwise, audit and shrink: the
    earliest node that diverges ON ITS OWN (fed with reference inputs) is where it is born
    ("local"); when no node does, the error is accumulated, and the layerwise row where it first
    crosses the tolerance is only where it becomes visible ("accumulated"). Without an isolated
    run (``diverging_alone`` None) only the crossing is known."""
    crossing = report.first[0] if report is not None and report.first else None
    seen = ({"crosses_at": crossing.node, "tensor": crossing.tensor, "op": crossing.op}
            if crossing is not None else {})
    if diverging_alone:
        node = diverging_alone[0]
        return {"kind": "local", "node": node, **seen,
                "words": f"divergence starts at {node}: it diverges on its own, fed with the reference inputs"}
    if diverging_alone is not None:
        where = f"; it first crosses the tolerance at {crossing.node} ({crossing.op})" if crossing else ""
        return {"kind": "accumulated", "node": None, **seen,
                "words": "accumulated error: no node diverges on its own (each fed with the reference inputs)"
                         + where + ", where the error built up over the layers before becomes visible"}
    if crossing is None:
        return {"kind": "none", "node": None, "words": "no tensor diverges"}
    return {"kind": "unknown", "node": crossing.node, **seen,
            "words": f"first diverging tensor with agreeing inputs: {crossing.node} ({crossing.op}); "
                     "whether it diverges on its own was not judged"}
