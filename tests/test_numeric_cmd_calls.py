"""A numeric ``cmd:`` check that runs the model costs what the built-in engine costs plus its
calibration (issue 39): at most 4 target calls on a local bug — the calibration pack (which is
also the confirmation), the survey, the shapes ladder, the result judged alone.

Engines are real: the check is a runner script (bench/hf_cases.py's RUNNER) that loads the ONNX
file it is given, runs it with reprokit's fp16 storage emulator and writes its outputs; the
reference is onnxruntime. Models: the bundled attention sample, and torch exports of real
architectures from ``transformers`` configs (random weights, no hub; cached in bench/.cache/hf)
with a planted ``Mul(k) → Div(k)`` overflow.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "attention_softmax_nan.onnx"


def _hf_cases():
    sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module("hf_cases")


def _needs_exports() -> None:
    pytest.importorskip(
        "transformers", reason="transformers is not installed (the exports need it)"
    )
    pytest.importorskip("torch", reason="torch is not installed (the exports need it)")


def _shrink(tmp_path, model: str, inputs: str | None, *extra: str) -> tuple[dict, int]:
    """A CLI shrink under the numeric runner check: (summary.json, runs of the check)."""
    hf = _hf_cases()
    runner = hf.write_runner(str(tmp_path / "runner"))
    log = tmp_path / "calls.log"
    out = tmp_path / "out"
    args = ["shrink", model, "--target", hf.cmd_target(runner), "-o", str(out), "--json", *extra]
    if inputs:
        args += ["--inputs", inputs]
    proc = run_cli(*args, timeout=600, env={"CALLS_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    return summary, len(log.read_text().splitlines())


def _steps(summary: dict) -> dict:
    return {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}


def test_a_numeric_check_reduces_the_bundled_sample_in_four_calls(tmp_path):
    summary, runs = _shrink(tmp_path, str(SAMPLE), str(SAMPLE).replace(".onnx", ".inputs.npz"))
    assert summary["minimal"]["ops"] == ["MatMul"]
    # the calibration pack confirms (no call of its own), the result is judged alone once
    assert summary["calls"]["target"] <= 4, _steps(summary)
    assert _steps(summary) == {"calibrate": 1, "survey": 1, "shapes": 1, "final": 1}
    assert summary["no_slippage"]["packs"].startswith("packed")
    assert summary["original_confirmed"].startswith("the calibration pack")
    assert "riding with the survey's packed call" in summary["original_replays"]
    assert runs >= summary["calls"]["target"]  # every target call ran the user's check


@pytest.mark.parametrize("case", ["efficientnet", "mobilenetv2", "bert"])
def test_a_numeric_check_reduces_a_planted_overflow_in_a_transformers_export_in_four_calls(
    tmp_path, case
):
    _needs_exports()
    hf = _hf_cases()
    model, inputs, planted = hf.planted_overflow(case)
    assert hf.node_count(model) >= 150
    summary, runs = _shrink(tmp_path, model, inputs)
    assert summary["minimal"]["node_names"] == [planted]
    assert summary["calls"]["target"] <= 4, _steps(summary)
    assert summary["no_slippage"]["packs"].startswith("packed")
    assert runs >= summary["calls"]["target"]


def test_every_model_a_numeric_check_is_given_is_valid_and_runs_on_the_reference(
    tmp_path, monkeypatch
):
    """The calibration pack (probe + a torch export), the survey pack, the shapes ladder and the
    result: onnx's full check passes under the opsets each declares, and onnxruntime runs it on
    the call's own feeds."""
    _needs_exports()
    import onnxruntime as ort

    from reprokit.api import RunOptions
    from reprokit.engine.oracle import Oracle
    from reprokit.shrink.steps import shrink

    hf = _hf_cases()
    model, inputs, planted = hf.planted_overflow("bert")
    seen = []
    real = Oracle.run_target

    def checked(self, model_path, feeds, output_names=None):
        given = onnx.load(model_path)
        onnx.checker.check_model(given, full_check=True)
        session = ort.InferenceSession(
            given.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        wanted = {i.name for i in session.get_inputs()}
        session.run(None, {k: np.asarray(v) for k, v in feeds.items() if k in wanted})
        seen.append([n.name for n in given.graph.node])
        return real(self, model_path, feeds, output_names)

    monkeypatch.setattr(Oracle, "run_target", checked)
    runner = hf.write_runner(str(tmp_path / "runner"))
    result = shrink(
        model, hf.cmd_target(runner), str(tmp_path / "out"), options=RunOptions(inputs=inputs)
    )
    assert result.summary["minimal"]["node_names"] == [planted]
    assert "reprokit_probe" in seen[0]  # the first call: the calibration pack, probe first
    assert len(seen) == result.summary["calls"]["target"] <= 4


# A pass/fail check that names {outputs} too (it fails by its exit status when the model holds a
# Softmax): the calibration made first is the group calibration, no call more than before.
SOFTMAX_FAILS = """
import sys
import onnx
model = onnx.load(sys.argv[1])
if any(n.op_type == "Softmax" for n in model.graph.node):
    print("engine error: Softmax not supported")
    sys.exit(1)
"""


def _softmax_chain(path: Path) -> str:
    """x[1,8] → Relu → Softmax → Mul(2) → Tanh → y: a Softmax in the middle of four nodes."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=-1),
        helper.make_node("Mul", ["s", "two"], ["m"], name="mul"),
        helper.make_node("Tanh", ["m"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "softmax_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def test_a_pass_fail_check_naming_outputs_pays_no_call_for_the_early_calibration(tmp_path):
    script = tmp_path / "softmax_fails.py"
    script.write_text(SOFTMAX_FAILS)
    model = _softmax_chain(tmp_path / "m.onnx")
    out = tmp_path / "out"
    target = f"cmd:{sys.executable} {script} {{model}} {{outputs}}"
    proc = run_cli("shrink", model, "--target", target, "-o", str(out), "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["signature"]["kind"] == "build-error"
    assert summary["minimal"]["node_names"] == ["softmax"]
    steps = _steps(summary)
    # one call confirms, the calibration pack (run first) carries the original's replay
    assert steps["confirm"] == 1 and steps["calibrate"] == 1, steps
    assert "replay" not in steps, steps
    assert summary["no_slippage"]["packs"].startswith("packed"), summary["no_slippage"]
