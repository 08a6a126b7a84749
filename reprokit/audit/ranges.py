"""Range audit: which captured tensors and which weights the target's narrow storage type cannot
hold — overflow past its maximum (the value becomes inf), values that flush to zero, and
cancellation (an Add/Sub whose O(1) result is smaller than the rounding error of its large
inputs). Pure numpy over one reference capture: it needs no target call.

Also derives the "suspected nodes" the sweep keeps in fp32: the connected run of producers whose
outputs leave the range, or, for a cancellation, the producers of the large inputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from reprokit.engine.layerwise import float_node_outputs
from reprokit.graph.index import consumers_of
from reprokit.standalone.compare import jsonable
from reprokit.standalone.values import RANGE, UNDERFLOW_SHARE

# Unit roundoff of each storage type: the relative error of one rounding.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4, "tf32": 2.0**-11}
# An underflow counts as severe (most of the tensor vanishes) from this share on.
SEVERE_UNDERFLOW = 0.5
_CANCELLING_OPS = ("Add", "Sub")


@dataclass
class RangeRow:
    """One tensor (activation or weight) and what its values do in the narrow type."""

    index: int  # depth in the layerwise table's topological order (weights: of their first reader)
    tensor: str
    node: str  # producer (activations) or first consumer (weights)
    op: str
    shape: list
    max_abs: float
    min_nonzero: float
    overflow: int  # values past the type's maximum
    underflow: int  # non-zero values that flush to zero
    nonzero: int
    finding: str = ""  # overflow, underflow, cancellation, or "" when representable
    severe: bool = False
    message: str = ""
    consumers: list = field(default_factory=list)  # weights: "node (op input 'slot')"
    readers: list = field(default_factory=list)  # weights: names of the nodes that read it
    large_inputs: list = field(default_factory=list)  # cancellation: producers of the big inputs

    def to_json(self) -> dict:
        out = asdict(self)
        for key in ("max_abs", "min_nonzero"):
            out[key] = jsonable(out[key])
        return out


@dataclass
class RangeReport:
    precision: str
    applicable: bool
    reason: str  # why not applicable, or the limits used
    maximum: float | None
    tiny: float | None
    rows: list[RangeRow]  # every activation, topological order (for the plot)
    weights: list[RangeRow]  # flagged weights only
    weights_checked: int

    @property
    def flagged(self) -> list[RangeRow]:
        return [r for r in self.rows if r.finding]

    @property
    def first(self) -> RangeRow | None:
        """The first severe finding in topological order, a weight counting at its first reader
        (else the first activation flagged at all; a weight with only a few flushed values is
        listed, never first)."""
        severe = sorted((r for r in self.flagged + self.weights if r.severe), key=lambda r: (r.index if r.index >= 0 else float("inf"), bool(r.readers)))
        return (severe or self.flagged or [None])[0]

    def to_json(self, limit: int = 200) -> dict:
        first = self.first
        return {
            "precision": self.precision, "applicable": self.applicable, "reason": self.reason,
            "maximum": self.maximum, "tiny": self.tiny, "tensors": len(self.rows),
            "flagged": [r.to_json() for r in self.flagged[:limit]],
            "first": first.to_json() if first else None,
        }




def _stats(array, maximum: float, tiny: float) -> tuple[float, float, int, int, int]:
    values = np.asarray(array)
    if values.dtype.kind != "f" or values.size == 0:
        return 0.0, 0.0, 0, 0, 0
    magnitude = np.abs(values[np.isfinite(values)]).astype(np.float64)
    nonzero = magnitude[magnitude > 0]
    max_abs = float(magnitude.max()) if magnitude.size else 0.0
    min_nonzero = float(nonzero.min()) if nonzero.size else 0.0
    return (max_abs, min_nonzero, int(np.count_nonzero(magnitude > maximum)),
            int(np.count_nonzero(nonzero < tiny)), int(nonzero.size))


def _judge(row: RangeRow, precision: str, maximum: float, tiny: float) -> None:
    if row.overflow:
        row.finding, row.severe = "overflow", True
        row.message = (f"{row.overflow} values beyond the {precision} maximum {maximum:g} "
                       f"(max |x| {row.max_abs:.4g}): stored in {precision} they become inf")
    elif row.nonzero and row.underflow >= UNDERFLOW_SHARE * row.nonzero:
        share = row.underflow / row.nonzero
        row.finding, row.severe = "underflow", share >= SEVERE_UNDERFLOW
        row.message = (f"{row.underflow} of {row.nonzero} non-zero values ({share:.0%}) are below "
                       f"{tiny:.3g} and flush to zero in {precision}")


def _rms(array) -> float:
    values = np.asarray(array, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.sqrt(np.mean(values * values))) if values.size else 0.0


def audit_ranges(model, activations, constants: dict, feeds: dict, precision: str,
                 tolerance: float) -> RangeReport:
    """Audit every captured float node output and every float weight of ``model``.

    ``activations`` maps tensor names to captured reference arrays (memory-mapped is fine);
    ``constants`` maps initializer names to arrays; ``tolerance`` is the verdict's bound, the
    level from which a cancellation's expected error counts.
    """
    limits = RANGE.get(precision)
    if limits is None:
        reason = (f"the target stores {precision}: no narrower range than fp32 to audit"
                  if precision in ("fp32", "tf32") else f"no range table for {precision}")
        return RangeReport(precision, False, reason, None, None, [], [], 0)
    maximum, tiny = limits
    unit = UNIT_ROUNDOFF[precision]
    producer = {t: (i, n.name, n.op_type) for i, n in enumerate(model.graph.node) for t in n.output if t}
    rows: list[RangeRow] = []
    for depth, (tensor, node, op, inputs) in enumerate(float_node_outputs(model)):
        if op == "Constant" or tensor not in activations:
            continue
        array = activations[tensor]
        stats = _stats(array, maximum, tiny)
        row = RangeRow(depth, tensor, node, op, list(np.shape(array)), *stats)
        _judge(row, precision, maximum, tiny)
        if not row.finding and op in _CANCELLING_OPS:
            _cancellation(row, inputs, activations, constants, feeds, producer, unit, tolerance, precision)
        rows.append(row)
    depth = {}
    for row in rows:
        depth.setdefault(row.node, row.index)
    weights, checked = audit_weights(model, constants, precision, depth)
    return RangeReport(precision, True, f"{precision}: max {maximum:g}, values below {tiny:.3g} flush to zero",
                       maximum, tiny, rows, weights, checked)


def _cancellation(row, inputs, activations, constants, feeds, producer, unit, tolerance, precision):
    """Flag an Add/Sub whose result is small next to the rounding error of its inputs."""
    out_rms = _rms(activations[row.tensor])
    if out_rms == 0:
        return
    big = []
    for name in inputs:
        source = activations[name] if name in activations else constants.get(name, feeds.get(name))
        if source is None:
            continue
        rms = _rms(source)
        if unit * rms / out_rms > tolerance:
            big.append((name, unit * rms / out_rms, rms))
    if not big:
        return
    name, worst, rms = max(big, key=lambda b: b[1])
    row.finding, row.severe = "cancellation", worst > 10 * tolerance
    row.large_inputs = [producer[n][1] for n, *_ in big if n in producer]
    row.message = (f"result rms {out_rms:.3g}, but input {name!r} has rms {rms:.4g}: its {precision} "
                   f"rounding alone is ~{worst:.2g} of the result (cancellation)")


def _slot_names(node, opset: int) -> list[str]:
    from onnx import defs

    try:
        schema = defs.get_schema(node.op_type, opset, node.domain or "")
        names = [i.name for i in schema.inputs]
    except Exception:  # unknown or custom op: positional names
        names = []
    return [names[i] if i < len(names) else f"input {i}" for i in range(len(node.input))]


def audit_weights(model, constants: dict, precision: str, depth: dict | None = None) -> tuple[list[RangeRow], int]:
    """Flag float weights the narrow type cannot hold, and BatchNormalization folds that
    overflow (TensorRT folds scale / sqrt(var + eps) into the preceding layer's weights)."""
    maximum, tiny = RANGE[precision]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    depth = depth or {}
    consumers: dict[str, list[str]] = {}
    readers: dict[str, list[str]] = {}
    first_consumer: dict[str, tuple[str, str]] = {}
    for node in model.graph.node:
        for name, slot in zip(node.input, _slot_names(node, opset)):
            if name in constants:
                consumers.setdefault(name, []).append(f"{node.name} ({node.op_type} input '{slot}')")
                readers.setdefault(name, []).append(node.name)
                first_consumer.setdefault(name, (node.name, node.op_type))
    flagged: list[RangeRow] = []
    checked = 0
    for name, array in constants.items():
        if np.asarray(array).dtype.kind != "f" or name not in consumers:
            continue
        checked += 1
        node, op = first_consumer[name]
        row = RangeRow(depth.get(node, -1), name, node, op, list(np.shape(array)), *_stats(array, maximum, tiny),
                       consumers=consumers[name][:6], readers=list(dict.fromkeys(readers[name])))
        _judge(row, precision, maximum, tiny)
        if row.finding:
            flagged.append(row)
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            row = _batchnorm_fold(node, constants, precision, maximum)
            if row is not None:
                row.index = depth.get(node.name, -1)
                flagged.append(row)
    return flagged, checked


def _batchnorm_fold(node, constants, precision, maximum) -> RangeRow | None:
    names = list(node.input)
    if len(names) < 5 or not all(n in constants for n in names[1:5]):
        return None
    scale, var = (np.asarray(constants[names[i]], dtype=np.float64) for i in (1, 4))
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    with np.errstate(divide="ignore", invalid="ignore"):
        folded = np.abs(scale / np.sqrt(var + eps))
    over = int(np.count_nonzero(~np.isfinite(folded) | (folded > maximum)))
    if not over:
        return None
    return RangeRow(-1, f"{node.name}: scale/sqrt(var+eps)", node.name, node.op_type, list(scale.shape),
                    float(np.nanmax(np.where(np.isfinite(folded), folded, 0))), 0.0, over, 0, int(folded.size),
                    finding="overflow", severe=True,
                    message=(f"the folded BatchNormalization multiplier scale/sqrt(var+eps) exceeds the "
                             f"{precision} maximum {maximum:g} in {over} channels (tiny variances)"),
                    consumers=[f"{node.name} (BatchNormalization)"], readers=[node.name])


def overflow_region(model, report: RangeReport, start: RangeRow, limit: int = 3) -> list[str]:
    """The producer of ``start`` and the connected producers downstream whose outputs show the
    same finding, topological order, at most ``limit`` nodes: what to keep in fp32 together."""
    by_tensor = {r.tensor: r for r in report.rows}
    consumers = _reader_nodes(model.graph)
    chosen, frontier = [start.node], [start.tensor]
    while frontier and len(chosen) < limit:
        tensor = frontier.pop(0)
        for node in consumers.get(tensor, []):
            for out in node.output:
                row = by_tensor.get(out)
                if row and row.finding == start.finding and node.name not in chosen and len(chosen) < limit:
                    chosen.append(node.name)
                    frontier.append(out)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return sorted(chosen, key=lambda n: order.get(n, 0))


def close_over_readers(model, report: RangeReport, group: list[str], limit: int = 6) -> list[str]:
    """``group`` with the readers that must stay fp32 with it: a node kept in fp32 hands its
    output to a narrow reader rounded (the conversion's Cast, TensorRT's reformat), so a value
    out of the narrow range is only safe once a kept reader has brought it back, and the large
    inputs of a cancellation only help when the cancelling node is kept too. Topological order,
    at most ``limit`` nodes."""
    by_tensor = {r.tensor: r for r in report.rows}
    nodes = {n.name: n for n in model.graph.node if n.name}
    consumers = _reader_nodes(model.graph)
    chosen = [n for n in group if n in nodes]
    frontier = list(chosen)
    while frontier and len(chosen) < limit:
        for out in nodes[frontier.pop(0)].output:
            row = by_tensor.get(out)
            out_of_range = row is not None and row.finding in ("overflow", "underflow")
            for reader in consumers.get(out, []):
                cancels = any(getattr(by_tensor.get(o), "finding", "") == "cancellation" for o in reader.output)
                if (out_of_range or cancels) and reader.name and reader.name not in chosen and len(chosen) < limit:
                    chosen.append(reader.name)
                    frontier.append(reader.name)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return sorted(dict.fromkeys(chosen), key=lambda n: order.get(n, 0)) + [n for n in group if n not in nodes]


def suspects_from_ranges(model, report: RangeReport) -> list[str]:
    """Nodes whose outputs to keep in fp32 so the first severe range finding cannot happen."""
    first = report.first
    if first is None:
        return []
    if first.readers:  # a weight: keep its readers in fp32 (their weights stay fp32 with them)
        return first.readers[:3]
    if first.finding == "cancellation":
        return list(dict.fromkeys(first.large_inputs))[:3]
    return overflow_region(model, report, first)


def _reader_nodes(graph) -> dict[str, list]:
    """tensor → the nodes of ``graph`` that read it (an If/Loop reading it in a body included)."""
    return {tensor: [graph.node[i] for i in readers] for tensor, readers in consumers_of(graph).items()}
