"""summary.json's ``build_work.heavy_built`` (issue 39): the heavy layers of every model the
target built in a run, the number the estimate of record prices (buildcost.ESTIMATE) — the bench
tables' est. TensorRT build column for reprokit's runs reads it. Checked against what the target
was really given: every model file that reaches ``Oracle.run_target`` during a real shrink (the
fp16 emulator on the bundled samples) is counted as it arrives, and the sums must agree, nodes
and heavy layers both, whatever step made the call (confirm, survey pack, localize, final...).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest

from reprokit.api import RunOptions
from reprokit.engine.oracle import Oracle
from reprokit.shrink.budget import Limits
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.steps import shrink

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

# A pass/fail check as a user wires one (calibration, group testing, replays: passfail.py's calls):
# fails (exit 1) while the model holds a Conv and a Clip.
CHECK = """
import sys
import onnx
ops = {n.op_type for n in onnx.load(sys.argv[1]).graph.node}
sys.exit(1 if {"Conv", "Clip"} <= ops else 0)
"""


@pytest.mark.parametrize(
    "name, pack_by, target",
    [
        ("attention_softmax_nan", "count", "emulate:fp16"),
        ("layernorm_overflow", "build-cost", "emulate:fp16"),
        ("conv_clip", "count", "emulate:fp16"),
        ("conv_clip", "count", "cmd"),
    ],
)
def test_heavy_built_is_what_the_target_was_given(tmp_path, monkeypatch, name, pack_by, target):
    seen = {"calls": 0, "nodes": 0, "heavy": 0}
    real = Oracle.run_target

    def counted(self, model_path, feeds, output_names=None):  # observes, then the real call
        model = onnx.load(model_path, load_external_data=False)
        seen["calls"] += 1
        seen["nodes"] += len(model.graph.node)
        seen["heavy"] += heavy_layers(model)
        return real(self, model_path, feeds, output_names)

    monkeypatch.setattr(Oracle, "run_target", counted)
    out = tmp_path / "out"
    if target == "cmd":
        (tmp_path / "check.py").write_text(CHECK)
        target = f"cmd:{sys.executable} {tmp_path / 'check.py'} {{model}}"
    shrink(
        str(SAMPLES / f"{name}.onnx"),
        target,
        str(out),
        options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz")),
        limits=Limits(pack_by=pack_by),
    )
    summary = json.loads((out / "summary.json").read_text())
    work = summary["build_work"]
    assert summary["calls"]["target"] == seen["calls"]
    assert work["nodes_built"] == seen["nodes"]
    assert work["heavy_built"] == seen["heavy"] > 0
    assert sum(s.get("heavy_built", 0) for s in summary["steps"]) == work["heavy_built"]
