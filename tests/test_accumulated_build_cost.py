"""An accumulated error shrunk with ``--pack-by build-cost`` (issue 39: the policy of ``trt``
targets, run here on the real bf16 emulator so that it is checked without a GPU).

The model is test_precision's accumulating MLP: x[8,64] → 24 × (MatMul → Tanh), each layer's bf16
error small, together over the tolerance (no node, no pair diverges alone). Packed by build cost
the run must reach the same answer as packed by count — accumulated, the same drift window —
within its automatic call budget, and build less: the fp32-nodes trials one whole model per call
(the packed search built 18 copies of the model), the printed workaround agreeing when run as
printed. On the code before this change the build-cost run stopped at its budget with no window.
The second model adds a bias Add per layer and runs on OpenVINO, whose elementwise nodes compute
the reference exactly alone: the pairs they produce are not built.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import shrink_models as sm
from conftest import run_cli
from onnx import helper
from test_precision import accumulating_mlp

from reprokit.api import RunOptions
from reprokit.shrink.budget import Limits
from reprokit.shrink.buildcost import TENSORRT
from reprokit.shrink.steps import shrink


def _shrink(model: str, feeds: str, out, pack_by: str) -> dict:
    shrink(model, "emulate:bf16", str(out), options=RunOptions(inputs=feeds, tolerance=0.01),
           limits=Limits(pack_by=pack_by))
    return json.loads((out / "summary.json").read_text())


def test_build_cost_finds_the_count_runs_drift_window_within_its_budget(tmp_path):
    model = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    feeds = str(tmp_path / "x.npz")
    np.savez(feeds, x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    by_count = _shrink(model, feeds, tmp_path / "count", "count")
    by_cost = _shrink(model, feeds, tmp_path / "cost", "build-cost")
    assert by_count["status"] == by_cost["status"] == "accumulated"
    assert not by_cost["budget"]["stopped"], by_cost["note"]
    window, same = by_cost["window"], by_count["window"]
    assert window is not None and (window["start"], window["nodes"]) == (same["start"], same["nodes"])
    assert window["error"] > window["tolerance"] == 0.01  # it drifts on its own
    built = by_cost["build_work"]["by_kind"]
    # whole models, one a call: two, or three where the survey's doubling chunks left the
    # bisection (capped at half the calls left) room for a ranked prefix of 12 that fails
    assert built["attribution: fp32-nodes trials"] <= 3 * 48
    assert by_cost["build_work"]["nodes_built"] < by_count["build_work"]["nodes_built"]
    found = by_cost["attribution"]["workaround"]
    assert found["method"] == "bisection" and found["agrees"]
    again = run_cli("check", model, "--target", found["setting"], "--tol", "0.01", "--inputs", feeds, "--json")
    assert again.returncode == 0, again.stdout[-400:]  # the workaround agrees, run exactly as printed


def biased_mlp(layers: int = 24):
    """x[8,64] → layers × (MatMul → Add(bias) → Tanh): OpenVINO's CPU plugin under bf16 runs the
    MatMuls narrow and computes each Tanh exactly alone, so every Tanh→MatMul pair is its MatMul."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for k in range(layers):
        inits += [sm.const(f"w{k}", rng.standard_normal((64, 64)) / 8), sm.const(f"b{k}", rng.standard_normal(64) / 4)]
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"], name=f"add{k}"),
                  helper.make_node("Tanh", [f"a{k}"], [f"t{k}"], name=f"tanh{k}")]
        h = f"t{k}"
    return sm.make(nodes, [sm.vi("x", [8, 64])], [sm.vi(h, [8, 64])], inits)


@pytest.fixture(scope="module")
def biased_runs(tmp_path_factory) -> dict:
    """The biased MLP shrunk on OpenVINO (bf16, tolerance 0.003) packed by count and by build
    cost: each run's summary.json."""
    pytest.importorskip("openvino", reason="OpenVINO not installed")
    tmp_path = tmp_path_factory.mktemp("biased")
    model = sm.save(biased_mlp(), tmp_path / "mlp.onnx")
    feeds = str(tmp_path / "x.npz")
    np.savez(feeds, x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    runs = {}
    for pack_by in ("count", "build-cost"):
        out = tmp_path / pack_by
        shrink(model, "openvino:bf16", str(out), options=RunOptions(inputs=feeds, tolerance=0.003),
               limits=Limits(pack_by=pack_by))
        runs[pack_by] = json.loads((out / "summary.json").read_text())
    return runs


def test_build_cost_builds_no_pair_whose_producer_is_exact_alone(biased_runs):
    """On OpenVINO (bf16, tolerance 0.003: each MatMul's error alone about 0.0025, the model's
    0.005) the run is accumulated either way. Packed by build cost, the pairs whose producer
    computed the reference's values exactly alone are not built (each is its consumer alone,
    judged in the survey) and the note says so; the drift window is the count run's. On the code
    before this change every one of the 71 pairs was built (142 nodes)."""
    by_count, by_cost = biased_runs["count"], biased_runs["build-cost"]
    assert by_count["status"] == by_cost["status"] == "accumulated"
    skipped = by_cost["attribution"].get("exact_pairs_not_built", 0)
    assert skipped >= 1 and f"{skipped} pairs were not built" in by_cost["note"]
    pairs = 3 * 24 - 1  # MatMul→Add, Add→Tanh per layer, Tanh→MatMul between layers
    assert by_cost["build_work"]["by_kind"]["pairs: asked"] == 2 * (pairs - skipped)
    window, same = by_cost["window"], by_count["window"]
    assert window is not None and (window["start"], window["nodes"]) == (same["start"], same["nodes"])


def test_build_cost_asks_the_rounds_inside_a_hit_one_pack_a_size(biased_runs):
    """The same biased MLP on OpenVINO (bf16, tolerance 0.003), packed by build cost: after the
    first tiling's hit, each refinement round asks each window size in one pack, not in the
    per-node fit's chunks of a few windows (each paying a call's fixed part for a few heavy
    layers). The drift window is the count run's; the drift window step makes at most 7 calls (on
    the code before this change 14, building the same 130 heavy layers)."""
    by_count, by_cost = biased_runs["count"], biased_runs["build-cost"]
    assert by_count["status"] == by_cost["status"] == "accumulated"
    window, same = by_cost["window"], by_count["window"]
    assert window is not None and (window["start"], window["nodes"]) == (same["start"], same["nodes"])
    assert window["error"] > window["tolerance"] == 0.003  # it drifts on its own
    step = next(s for s in by_cost["steps"] if s["step"] == "drift window")
    # the first tiling (eighths, quarters, halves: chunks until the hit), then one call a size for
    # each round inside the hit, and the window judged alone
    assert 1 <= step["calls"] <= 7, step


def test_build_cost_survey_without_a_hit_costs_log2_calls(tmp_path):
    """test_precision's accumulating MLP (48 nodes, no node diverges alone under bf16) packed by
    build cost: the survey judges every single, in chunks that start at the per-node fit's size
    and double, so it costs ceil(log2(48/first + 1)) calls (3) plus the marked copy; on the code
    before this change the chunks stayed at the first size: ceil(48/15) = 4 calls plus it."""
    model = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    feeds = str(tmp_path / "x.npz")
    np.savez(feeds, x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    summary = _shrink(model, feeds, tmp_path / "cost", "build-cost")
    assert summary["status"] == "accumulated"
    assert summary["attribution"]["diverging_alone"] == 0  # every single judged, none a hit
    nodes = summary["original"]["nodes"]
    first = TENSORRT.chunk_nodes(nodes)
    step = next(s for s in summary["steps"] if s["step"] == "survey")
    assert summary["build_work"]["by_kind"]["survey: asked"] == nodes
    assert step["calls"] == math.ceil(math.log2(nodes / first + 1)) + 1 < math.ceil(nodes / first) + 1, step
