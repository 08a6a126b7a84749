"""Which nodes to suspect, from an audit's findings: the range audit's first finding with its
connected run and the readers that must stay fp32 with it, the layerwise first diverging nodes,
where the error is born (the isolated run), where the verdict's own kind starts, and the
amplifiers (tensors whose error grows much faster than their inputs'). Runs no engine.
"""

from __future__ import annotations

from reprokit.audit.ranges import close_over_readers, suspects_from_ranges
from reprokit.engine.layerwise import float_node_outputs


def amplifiers(model, layer, limit: int = 5) -> list[dict]:
    """Diverging tensors whose relative error is much larger than their inputs' (where the error
    grows: a saturated Sigmoid, a cancellation), largest growth first."""
    import math

    inputs = {t: ins for t, _, _, ins in float_node_outputs(model)}
    errors = {r.tensor: r.error.rel_l2 for r in layer.rows}
    found = []
    for row in layer.rows:
        if not row.error.exceeds or not math.isfinite(row.error.rel_l2):
            continue
        before = [errors[i] for i in inputs.get(row.tensor, []) if i in errors and math.isfinite(errors[i])]
        if before and max(before) > 0 and row.error.rel_l2 >= 2 * max(before):
            found.append({"index": row.index, "node": row.node, "op": row.op, "tensor": row.tensor,
                          "input_rel_l2": max(before), "rel_l2": row.error.rel_l2,
                          "growth": row.error.rel_l2 / max(before)})
    return sorted(found, key=lambda f: -f["growth"])[:limit]


def _kind(row) -> str:
    if row.error.nonfinite_in_target_only:
        return "nonfinite"
    return "mismatch" if row.error.exceeds else "agree"


def suspects(model, ranges, layer, verdict, isolated=None) -> dict:
    """Nodes to keep in fp32: the range audit's first finding (with its connected run), the
    layerwise first diverging nodes, where the error is born (the nodes with the largest error
    alone, from the isolated run; and the first diverging node with the nodes that feed it, for a
    cancellation whose inputs already carry the error), and where the verdict's own kind starts."""
    first = [r.node for r in layer.first][:3]
    producer = {o: (n.name or f"{n.op_type}_{i}") for i, n in enumerate(model.graph.node) for o in n.output}
    feeding = []
    if layer.first:
        row = layer.first[0]
        feeding = [producer[t] for t in next((ins for t, _, _, ins in float_node_outputs(model) if t == row.tensor), [])
                   if t in producer] + [row.node]
    born = []
    if isolated and isolated.get("top"):
        alone = [r["node"] for r in isolated["top"] if r["kind"] != "agree"]
        born = (alone or [isolated["top"][0]["node"]])[:3]
    status = {r.tensor: _kind(r) for r in layer.rows}
    inputs = {t: ins for t, _, _, ins in float_node_outputs(model)}
    wanted = verdict.kind.value if verdict is not None else "-"
    anchors = [r.node for r in layer.rows
               if status[r.tensor] == wanted and not any(status.get(i) == wanted for i in inputs.get(r.tensor, []))]
    region = suspects_from_ranges(model, ranges)
    candidates: list[list[str]] = []
    # Where the verdict's kind starts (shrink's anchors) is reported, not tried: its inputs
    # already carry the error, so keeping that node alone in fp32 cannot help.
    for group in (region, first[:1], first, region + [n for n in first if n not in region][:1], born, feeding):
        group = list(dict.fromkeys(group))[:3]
        if ranges is not None and ranges.applicable:  # with the readers that must stay fp32 too
            group = close_over_readers(model, ranges, group)
        if group and group not in candidates:
            candidates.append(group)
    candidates.sort(key=len)
    return {"range_region": region, "layerwise_first": first, "kind_starts": list(dict.fromkeys(anchors))[:3],
            "born_alone": born, "first_with_inputs": feeding[:3], "candidates": candidates[:5]}
