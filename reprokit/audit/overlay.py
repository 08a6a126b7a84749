"""Model Explorer overlays: an audit's per-node numbers as node data files that Google's Model
Explorer (``pip install ai-edge-model-explorer model-explorer-onnx``) paints on the graph.

The format is the one ``model_explorer.node_data_builder.ModelNodeData`` writes: a JSON object
keyed by graph id, each ``{"results": {node id: {"value": number, "bgColor"?: css}},
"thresholds": [{"value": upper bound, "bgColor": css}]}``. The ONNX adapter
(``model_explorer_onnx``) names the main graph by ``graph.name`` and a node by its name after
onnx_ir's NameFixPass (an unnamed node becomes ``node``, ``node_1`` …), so a node that reprokit
shows as ``OP_INDEX`` is written under the name the adapter gives it.

One file per quantity (Model Explorer shows one value per node and file):

- ``overlay-layerwise.json`` — each node's largest marked (layerwise) error against the
  reference, in the criterion's metric; NaN/Inf where the reference is finite as 3e38, dark red;
- ``overlay-isolated.json`` — each node's error alone, fed with the reference activations (the
  nodes the audit measured that way: the largest ones);
- ``overlay-ranges.json`` — the range audit's flags: 3 overflow, 2 cancellation, 1 severe
  underflow, 0.5 underflow (a node reading a flagged weight counts as that weight's finding);
- ``overlay-kept.json`` (shrink) — 1 on the nodes the minimal model kept.

Pure JSON from an audit payload; imports nothing of Model Explorer.
"""

from __future__ import annotations

import json
import math
import os

from reprokit.files import atomic_text
from reprokit.graph.io import load_model
from reprokit.graph.model import node_label

NONFINITE = 3.0e38  # stands for NaN/Inf (JSON has neither); the largest threshold paints it
RANGE_CODES = {"overflow": 3.0, "cancellation": 2.0, "underflow": 1.0}
MILD_UNDERFLOW = 0.5
FILES = {"layerwise": "overlay-layerwise.json", "isolated": "overlay-isolated.json",
         "ranges": "overlay-ranges.json", "kept": "overlay-kept.json"}
_GREEN, _LIGHT, _ORANGE, _RED, _DARK = "#c8e6c9", "#8bc34a", "#ffa000", "#ff5722", "#b71c1c"


def adapter_ids(model) -> tuple[str, dict[str, str]]:
    """(graph id, {reprokit node label: Model Explorer node id}) for the model file's main graph."""
    names = _adapter_node_names(model)
    return model.graph.name, {node_label(n, i): names[i] for i, n in enumerate(model.graph.node)}


def _adapter_node_names(model) -> list[str]:
    """The node names the ONNX adapter shows: it runs onnx_ir's NameFixPass first (an unnamed node
    becomes ``node``, ``node_1`` …, a repeated name gets a suffix). That pass itself where onnx_ir
    is installed (it comes with model-explorer-onnx), else the same rule over the main graph."""
    try:
        import onnx_ir as ir
        from onnx_ir.passes.common import NameFixPass
    except ImportError:
        used: set[str] = set()
        counter: dict[str, int] = {}
        names = []
        for node in model.graph.node:
            name = preferred = node.name or "node"
            while name in used:
                counter[preferred] = counter.get(preferred, 0) + 1
                name = f"{preferred}_{counter[preferred]}"
            used.add(name)
            names.append(name)
        return names
    graph = ir.serde.deserialize_model(model)
    NameFixPass()(graph)
    return [node.name for node in graph.graph]


def _number(value) -> float:
    """An error as JSON writes it (a float, or "inf"/"nan") → a finite number for the overlay."""
    value = float(value)
    return value if math.isfinite(value) else NONFINITE


def _error_thresholds(tolerance: float) -> list[dict]:
    """Colours by the criterion: within a tenth of the tolerance, within it, up to 10x, 1000x, more."""
    return [{"value": tolerance / 10, "bgColor": _GREEN}, {"value": tolerance, "bgColor": _LIGHT},
            {"value": tolerance * 10, "bgColor": _ORANGE}, {"value": tolerance * 1000, "bgColor": _RED},
            {"value": NONFINITE, "bgColor": _DARK}]


def _largest(results: dict, node_id: str, value: float, nonfinite: bool = False) -> None:
    entry = {"value": NONFINITE if nonfinite else value}
    if nonfinite:
        entry["bgColor"] = _DARK
    if node_id not in results or entry["value"] > results[node_id]["value"]:
        results[node_id] = entry


def overlays(payload: dict, model) -> dict[str, dict]:
    """The node data of each overlay (kind → ModelNodeData JSON) for an audit payload."""
    graph, ids = adapter_ids(model)
    tolerance = float(payload["criterion"]["tolerance"])
    out: dict[str, dict] = {}
    layer = {}
    for row in payload.get("layerwise", {}).get("rows", []):
        if row["node"] in ids:
            _largest(layer, ids[row["node"]], _number(row["error"]), bool(row.get("nonfinite_in_target_only")))
    if layer:
        out["layerwise"] = {graph: {"results": layer, "thresholds": _error_thresholds(tolerance)}}
    alone = {}
    for row in (payload.get("isolated") or {}).get("top", []):
        if row["node"] in ids:
            _largest(alone, ids[row["node"]], _number(row["error"]), row.get("kind") == "nonfinite")
    if alone:
        out["isolated"] = {graph: {"results": alone, "thresholds": _error_thresholds(tolerance)}}
    ranges = payload.get("ranges") or {}
    if ranges.get("applicable"):
        flags = {}
        for row in ranges.get("flagged", []) + payload.get("weights", {}).get("flagged", []):
            code = RANGE_CODES.get(row["finding"], 0.0)
            if row["finding"] == "underflow" and not row.get("severe"):
                code = MILD_UNDERFLOW
            for node in row.get("readers") or [row["node"]]:
                if node in ids:
                    _largest(flags, ids[node], code)
        thresholds = [{"value": MILD_UNDERFLOW, "bgColor": _LIGHT}, {"value": 1.0, "bgColor": _ORANGE},
                      {"value": 2.0, "bgColor": _RED}, {"value": 3.0, "bgColor": _DARK}]
        out["ranges"] = {graph: {"results": flags, "thresholds": thresholds}}
    kept = (payload.get("minimal") or {}).get("node_names") or []
    if kept:
        out["kept"] = {graph: {"results": {ids[n]: {"value": 1, "bgColor": _RED} for n in kept if n in ids}}}
    return out


def open_command(model_path: str, paths: list[str]) -> str:
    """The one command that opens the model with these overlays."""
    import shlex

    return (f"model-explorer {shlex.quote(model_path)} --extensions=model_explorer_onnx "
            f"--node_data_paths={shlex.quote(','.join(paths))}")


def write_overlays(payload: dict, out_dir: str) -> dict[str, str]:
    """Write the overlays of ``payload`` (an audit's JSON) beside it; kind → path written."""
    model = load_model(payload["model"], load_weights=False)
    written = {}
    for kind, data in overlays(payload, model).items():
        path = os.path.join(out_dir, FILES[kind])
        atomic_text(path, json.dumps(data, indent=2))
        written[kind] = path
    return written
