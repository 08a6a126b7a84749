"""An accumulated error shrunk with ``--pack-by build-cost`` (issue 39: the policy of ``trt``
targets, run here on the real bf16 emulator so that it is checked without a GPU).

The model is test_precision's accumulating MLP: x[8,64] → 24 × (MatMul → Tanh), each layer's bf16
error small, together over the tolerance (no node, no pair diverges alone). Packed by build cost
the run must reach the same answer as packed by count — accumulated, the same drift window —
within its automatic call budget, and build less: the fp32-nodes trials one whole model per call
(the packed search built 18 copies of the model), the printed workaround agreeing when run as
printed. On the code before this change the build-cost run stopped at its budget with no window.
"""

from __future__ import annotations

import json

import numpy as np
import shrink_models as sm
from conftest import run_cli
from test_precision import accumulating_mlp

from reprokit.api import RunOptions
from reprokit.shrink.budget import Limits
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
    assert built["attribution: fp32-nodes trials"] <= 2 * 48  # two whole models, one a call
    assert by_cost["build_work"]["nodes_built"] < by_count["build_work"]["nodes_built"]
    found = by_cost["attribution"]["workaround"]
    assert found["method"] == "bisection" and found["agrees"]
    again = run_cli("check", model, "--target", found["setting"], "--tol", "0.01", "--inputs", feeds, "--json")
    assert again.returncode == 0, again.stdout[-400:]  # the workaround agrees, run exactly as printed
