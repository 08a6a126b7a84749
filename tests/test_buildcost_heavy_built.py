"""summary.json's ``build_work.heavy_built`` (issue 39): the heavy layers of every model the
target built in a run, the number the estimate of record prices (buildcost.ESTIMATE) — the bench
tables' est. TensorRT build column for reprokit's runs reads it. Checked against what the target
was really given: every model file that reaches ``Oracle.run_target`` during a real shrink (the
fp16 emulator on the bundled samples) is counted as it arrives, and the sums must agree, nodes
and heavy layers both, whatever step made the call (confirm, survey pack, localize, final...).
The calls whose model holds no heavy layer (``light_calls``/``light_nodes``, priced at the light
rate) likewise, and against bench/count_check.py's log of a real pass/fail check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import shrink_models as sm
from test_precision import accumulating_mlp

from reprokit.api import RunOptions
from reprokit.engine.oracle import Oracle
from reprokit.shrink.budget import Limits
from reprokit.shrink.buildcost import ESTIMATE, heavy_layers
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


def _observe(monkeypatch) -> dict:
    """Counts every model file that reaches ``Oracle.run_target`` as it arrives (then makes the
    real call): calls, nodes, heavy layers, and the calls with no heavy layer and their nodes."""
    seen = {"calls": 0, "nodes": 0, "heavy": 0, "light_calls": 0, "light_nodes": 0}
    real = Oracle.run_target

    def counted(self, model_path, feeds, output_names=None):
        model = onnx.load(model_path, load_external_data=False)
        heavy = heavy_layers(model)
        seen["calls"] += 1
        seen["nodes"] += len(model.graph.node)
        seen["heavy"] += heavy
        seen["light_calls"] += not heavy
        seen["light_nodes"] += 0 if heavy else len(model.graph.node)
        return real(self, model_path, feeds, output_names)

    monkeypatch.setattr(Oracle, "run_target", counted)
    return seen


def _agrees(summary: dict, seen: dict) -> None:
    """summary.json's build work is what the target was given, in total and over the steps."""
    work = summary["build_work"]
    assert summary["calls"]["target"] == seen["calls"]
    assert work["nodes_built"] == seen["nodes"]
    assert work["heavy_built"] == seen["heavy"] > 0
    assert (work["light_calls"], work["light_nodes"]) == (seen["light_calls"], seen["light_nodes"])
    for key in ("heavy_built", "light_calls", "light_nodes"):
        assert sum(s.get(key, 0) for s in summary["steps"]) == work[key]


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
    seen = _observe(monkeypatch)
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
    _agrees(json.loads((out / "summary.json").read_text()), seen)


def test_an_accumulated_run_counts_its_precision_search_s_builds(tmp_path, monkeypatch):
    """An accumulated error (test_precision's MLP, x[8,64] → 24 × (MatMul → Tanh), bf16): the
    attribution step's fp32-nodes trials are built by oracles of their own (precision.Search),
    whose build work joins the step's (every call of this run holds a MatMul: light calls 0).
    On the code before light calls were counted the summary had no ``light_calls``."""
    seen = _observe(monkeypatch)
    model = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    feeds = str(tmp_path / "x.npz")
    np.savez(feeds, x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    out = tmp_path / "out"
    shrink(model, "emulate:bf16", str(out), options=RunOptions(inputs=feeds, tolerance=0.01))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "accumulated"
    assert {s["step"]: s["calls"] for s in summary["steps"]}.get("attribution", 0) > 0
    _agrees(summary, seen)


def test_light_calls_are_what_count_check_counts_on_the_files_the_check_received(tmp_path):
    """The bench tables price both tools' calls from the same rule: bench/count_check.py wraps a
    real pass/fail check and logs each file it receives (its nodes, its heavy layers); the calls
    with no heavy layer, and their nodes, must be summary.json's ``light_calls``/``light_nodes``
    (in total and over the steps), so a run's light calls are priced at the light rate in
    bench_shrink as they are in bench_passfail. conv_clip (a 69-node CNN sample) under a check
    failing while a Conv and a Clip are both present: the group tests build packs with and
    without a Conv. bench/cost_split.py's fixed + search of that summary is the whole run priced
    from the log, as bench_passfail prices it."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "bench"))
    import cost_split
    from count_check import model_work, read_log

    (tmp_path / "check.py").write_text(CHECK)
    log = tmp_path / "calls.log"
    count = f"{sys.executable} {root / 'bench' / 'count_check.py'} {log}"
    out = tmp_path / "out"
    shrink(
        str(SAMPLES / "conv_clip.onnx"),
        f"cmd:{count} {sys.executable} {tmp_path / 'check.py'} {{model}}",
        str(out),
        options=RunOptions(inputs=str(SAMPLES / "conv_clip.inputs.npz")),
    )
    logged = read_log(str(log))
    light = [nodes for nodes, heavy in logged if heavy == 0]
    summary = json.loads((out / "summary.json").read_text())
    work = summary["build_work"]
    assert summary["calls"]["target"] == len(logged)
    assert work["heavy_built"] == sum(heavy for _, heavy in logged) > 0
    assert (work["light_calls"], work["light_nodes"]) == (len(light), sum(light))
    assert 0 < work["light_calls"] < len(logged)  # both kinds of call made: the rule is exercised
    for key in ("light_calls", "light_nodes"):
        assert sum(s[key] for s in summary["steps"]) == work[key]
    whole = ESTIMATE.seconds(len(logged), work["heavy_built"], len(light), sum(light))
    fixed, search = cost_split.split(
        summary["steps"],
        work["by_kind"],
        summary["original"]["nodes"],
        model_work(str(SAMPLES / "conv_clip.onnx"))[1],
    )
    assert fixed + search == pytest.approx(whole)
    assert 0 < fixed < whole  # the confirmation and the result's runs, beside a search
