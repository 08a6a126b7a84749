"""Model Explorer overlays written by ``audit`` (and ``shrink --overlay``): node data files that
Google's Model Explorer reads, checked with the package's own pieces — the ONNX adapter
(model_explorer_onnx) converts the same model file and every node id and the graph id must be
among its graph's; model_explorer's node_data_builder dataclasses load each file strictly
(dacite, as model_explorer's own node data providers do). Skipped with the reason where the
packages are not installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import onnx
import pytest
from conftest import REPO, run_cli
from onnx import TensorProto, helper

from reprokit.audit.overlay import NONFINITE, adapter_ids

HAS_EXPLORER = all(importlib.util.find_spec(m) is not None for m in ("model_explorer", "model_explorer_onnx", "dacite"))
needs_explorer = pytest.mark.skipif(not HAS_EXPLORER, reason="ai-edge-model-explorer / model-explorer-onnx not "
                                    "installed (pip install ai-edge-model-explorer model-explorer-onnx)")


def _load_with_model_explorer(path: Path, model_path: str) -> dict:
    """The file as Model Explorer's dataclasses take it; its ids checked against the adapter's graph."""
    import dacite
    from model_explorer import node_data_builder as ndb
    from model_explorer_onnx.main import ONNXAdapter

    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in {path.name}"))
    graphs = {g.id: {n.id for n in g.nodes} for g in ONNXAdapter().convert(model_path, {})["graphs"]}
    strict = dacite.Config(strict=True)
    model_data = ndb.ModelNodeData(graphsData={g: dacite.from_dict(ndb.GraphNodeData, v, config=strict)
                                               for g, v in data.items()})
    for graph_id, graph_data in model_data.graphsData.items():
        assert graph_id in graphs, (graph_id, list(graphs))
        unknown = set(graph_data.results) - graphs[graph_id]
        assert not unknown, f"{path.name}: node ids the adapter does not have: {sorted(unknown)[:5]}"
        for result in graph_data.results.values():
            assert isinstance(result.value, (int, float)) and result.value == result.value
    assert json.loads(model_data.to_json_string()).keys() == data.keys()  # writes back the same graphs
    return data


@pytest.mark.slow
@needs_explorer
def test_audit_overlays_of_a_sample_load_in_model_explorer(tmp_path):
    sample = str(REPO / "samples" / "attention_softmax_nan.onnx")
    out = tmp_path / "audit"
    proc = run_cli("audit", sample, "--target", "emulate:fp16", "-o", str(out), "--no-sweep", "--no-explain",
                   "--inputs", str(REPO / "samples" / "attention_softmax_nan.inputs.npz"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    payload = json.loads((out / "audit.json").read_text())
    assert sorted(payload["overlay"]["files"]) == ["overlay-isolated.json", "overlay-layerwise.json",
                                                   "overlay-ranges.json"]
    assert "--node_data_paths=" in payload["overlay"]["command"] and "model-explorer" in proc.stdout
    layer = _load_with_model_explorer(out / "overlay-layerwise.json", sample)
    ranges = _load_with_model_explorer(out / "overlay-ranges.json", sample)
    isolated = _load_with_model_explorer(out / "overlay-isolated.json", sample)
    (graph,) = layer
    first = payload["ranges"]["first"]["node"]  # the MatMul whose logits pass fp16's maximum
    assert ranges[graph]["results"][first]["value"] == 3.0  # overflow
    assert layer[graph]["results"][first]["value"] == NONFINITE  # inf in the target, finite in the reference
    assert len(layer[graph]["results"]) == len({r["node"] for r in payload["layerwise"]["rows"]})
    assert first in isolated[graph]["results"]


@needs_explorer
def test_unnamed_nodes_get_the_adapters_ids(tmp_path):
    """x[4] → Mul(1e5) → Relu → Neg 'named' → Exp → y, three nodes unnamed: their overlay keys
    are the names the ONNX adapter gives them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [1e5])
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Neg", ["r"], ["n"], name="named"), helper.make_node("Exp", ["n"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "", [x], [y], [scale]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "unnamed.onnx")
    onnx.save(model, path)
    graph, ids = adapter_ids(model)
    assert ids["Mul_0"] != ids["Relu_1"] and ids["named"] == "named"
    out = tmp_path / "audit"
    proc = run_cli("audit", path, "--target", "emulate:fp16", "-o", str(out), "--no-sweep", "--no-explain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranges = _load_with_model_explorer(out / "overlay-ranges.json", path)
    assert ranges[graph]["results"][ids["Mul_0"]]["value"] == 3.0  # 1e5·x overflows fp16
    layer = _load_with_model_explorer(out / "overlay-layerwise.json", path)
    assert set(layer[graph]["results"]) <= set(ids.values())
