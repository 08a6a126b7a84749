"""Packs are the user's model (issue 39): every pack, probe and calibration model declares the
opsets, IR version and domains its members need, so a check that runs the model with its own
tools (a numeric ``cmd:`` check) sees a valid model, torch exports included.

Engines are real: onnxruntime for the reference and in the check script, reprokit's fp16 storage
emulator behind a ``cmd:`` check. The model is tests/torch_models.py's transformer block exported
by torch's legacy exporter at opset 17 (its ``Reshape`` nodes carry ``allowzero=0``, an attribute
opset 13 does not know), with attention logits scaled past fp16's range (the planted overflow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper

from reprokit.graph.extract import Extraction
from reprokit.graph.pack import build_pack
from reprokit.shrink.confirm import PROBE_FEEDS, probe_model

REPO = Path(__file__).resolve().parent.parent
MODELS = str(REPO / "tests" / "torch_models.py")
PY = sys.executable

try:
    import torch  # noqa: F401

    HAS_TORCH = True
except ImportError:
    HAS_TORCH = False
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="torch is not installed (pip install 'reprokit[torch]')"
)

# A numeric check the way a TensorRT user wires a runner script: run the model (here with
# reprokit's fp16 storage emulator standing in for the engine), write its outputs; one log line a call.
EMULATING_CHECK = """
import sys
import numpy as np
from reprokit.engine.backends import create_backend
from reprokit.spec import parse_target
model, inputs, outputs = sys.argv[1:4]
with open({log!r}, "a") as handle:
    handle.write(model + "\\n")
with np.load(inputs) as data:
    feeds = {{k: data[k] for k in data.files}}
values = create_backend(parse_target("emulate:fp16")).run(model, feeds, None).outputs
np.savez(outputs, **values)
"""


@pytest.fixture(scope="module")
def torch_export(tmp_path_factory):
    if not HAS_TORCH:
        pytest.skip("torch is not installed (pip install 'reprokit[torch]')")
    from reprokit.torch_export import export

    folder = tmp_path_factory.mktemp("export")
    exported = export(
        f"{MODELS}:transformer_block_overflow", str(folder), exporter="legacy", opset=17
    )
    model = onnx.load(exported.model_path)
    assert any(
        a.name == "allowzero"
        for n in model.graph.node
        if n.op_type == "Reshape"
        for a in n.attribute
    )
    return exported


def _opset13_probe():
    """x[1] → Identity → y, written at opset 13 / IR 8 (the probe reprokit used to write)."""
    return helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"], name="reprokit_probe")],
            "reprokit_probe",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        ),
        opset_imports=[helper.make_opsetid("", 13)],
        ir_version=8,
    )


def _run(model, feeds: dict) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@needs_torch
@pytest.mark.parametrize("probe", ["opset13", "like_the_model"])
def test_a_pack_of_a_probe_and_a_torch_export_is_a_valid_model_that_computes_the_export(
    torch_export, probe
):
    model = onnx.load(torch_export.model_path)
    with np.load(torch_export.inputs_path) as data:
        feeds = {k: data[k] for k in data.files}
    first = _opset13_probe() if probe == "opset13" else probe_model(model)
    members = [
        Extraction(first, dict(PROBE_FEEDS), ["y"]),
        Extraction(model, feeds, [o.name for o in model.graph.output]),
    ]
    pack = build_pack(members, keep_node_names=False)
    onnx.checker.check_model(pack.model, full_check=True)  # opset 13 rejects Reshape's allowzero
    assert {o.domain or "": o.version for o in pack.model.opset_import}[""] == 17
    assert pack.model.ir_version == model.ir_version
    packed = _run(pack.model, pack.feeds)
    alone = _run(model, feeds)
    for name, original in pack.members[1].outputs.items():
        np.testing.assert_array_equal(packed[name], alone[original])


@needs_torch
def test_the_probe_declares_the_models_opsets_and_ir_version(torch_export):
    model = onnx.load(torch_export.model_path)
    probe = probe_model(model)
    onnx.checker.check_model(probe, full_check=True)
    assert {(o.domain, o.version) for o in probe.opset_import} >= {
        (o.domain, o.version) for o in model.opset_import
    }
    assert probe.ir_version == model.ir_version
    np.testing.assert_array_equal(_run(probe, PROBE_FEEDS)["y"], PROBE_FEEDS["x"])


def test_a_pack_declares_every_domain_and_local_function_of_its_members():
    # member 0: x → Identity → y (opset 13); member 1: x → custom.Twice (a local function of
    # domain "custom": Add(x, x)) → y, at opset 18
    twice = helper.make_function(
        "custom",
        "Twice",
        ["a"],
        ["b"],
        [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["y"], domain="custom", name="twice")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    custom = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)],
        ir_version=9,
        functions=[twice],
    )
    x = np.array([1.0, -2.0], np.float32)
    pack = build_pack(
        [
            Extraction(_opset13_probe(), dict(PROBE_FEEDS), ["y"]),
            Extraction(custom, {"x": x}, ["y"]),
        ],
        keep_node_names=False,
    )
    onnx.checker.check_model(pack.model, full_check=True)
    assert {(o.domain or "", o.version) for o in pack.model.opset_import} == {
        ("", 18),
        ("custom", 1),
    }
    assert pack.model.ir_version == 9 and [f.name for f in pack.model.functions] == ["Twice"]
    packed = _run(pack.model, pack.feeds)
    np.testing.assert_array_equal(packed[next(iter(pack.members[1].outputs))], 2 * x)


@needs_torch
def test_a_numeric_cmd_check_that_runs_a_torch_export_reduces_the_planted_overflow(
    torch_export, tmp_path
):
    log = tmp_path / "calls.log"
    script = tmp_path / "check.py"
    script.write_text(EMULATING_CHECK.format(log=str(log)))
    target = f"cmd:precision=fp16:{PY} {script} {{model}} {{inputs}} {{outputs}}"
    out = tmp_path / "out"
    proc = run_cli(
        "shrink",
        torch_export.model_path,
        "--inputs",
        torch_export.inputs_path,
        "--target",
        target,
        "-o",
        str(out),
        "--json",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["minimal"]["nodes"] < summary["original"]["nodes"] / 4
    assert summary["minimal"]["ops"] == ["Mul"]  # the logits' scaling, where fp16 overflows
    packs = summary.get("no_slippage", {}).get("packs", "")
    assert packs.startswith("packed"), (
        packs
    )  # the calibration pack was a valid model: packs stay on
    # every target call ran the check (the archive's own reproduction runs it twice more)
    assert len(log.read_text().splitlines()) >= summary["calls"]["target"]
    # the built-in emulator's calls plus the check's calibration: confirm, calibrate, one survey
    # (the final replays and the shape pass are their own, fixed steps)
    steps = {s["step"]: s["calls"] for s in summary["steps"]}
    search = sum(n for step, n in steps.items() if step not in ("shapes", "final", "pack"))
    assert search <= 4, steps


@pytest.mark.parametrize("rtx", [False, True])
def test_a_trt_runs_summary_names_the_one_timing_cache_every_build_shares(
    tmp_path, monkeypatch, rtx
):
    from reprokit.shrink.output import timing_cache_note
    from reprokit.shrink.runstate import _with_timing_cache

    monkeypatch.setenv("POLYGRAPHY_USE_TENSORRT_RTX", "1" if rtx else "0")
    target = _with_timing_cache("trt:fp16", str(tmp_path / ".reprokit"))
    note = timing_cache_note(target)
    assert note["path"] == str(tmp_path / ".reprokit" / "timing.cache")
    assert "every TensorRT build of this run" in note["shared"]
    assert ("TensorRT-RTX ignores timing caches" in note["shared"]) == rtx
    mine = timing_cache_note("trt:timing-cache=/data/cache.bin")
    assert mine["path"] == "/data/cache.bin"
    assert timing_cache_note("emulate:fp16") is None


# A runner that feeds exactly one input (as many a deployment script does), its engine reprokit's
# fp16 emulator: a pack, which has one input per member cut, is refused with the runner's words.
ONE_INPUT_CHECK = """
import sys
import numpy as np
import onnx
from reprokit.engine.backends import create_backend
from reprokit.spec import parse_target
model, inputs, outputs = sys.argv[1:4]
if len(onnx.load(model, load_external_data=False).graph.input) != 1:
    print("my runner feeds one input, this model has more")
    sys.exit(3)
with np.load(inputs) as data:
    feeds = {k: data[k] for k in data.files}
np.savez(outputs, **create_backend(parse_target("emulate:fp16")).run(model, feeds, None).outputs)
"""


@needs_torch
def test_a_check_that_refuses_packs_says_why_in_the_summary(torch_export, tmp_path):
    script = tmp_path / "check.py"
    script.write_text(ONE_INPUT_CHECK)
    target = f"cmd:precision=fp16:{PY} {script} {{model}} {{inputs}} {{outputs}}"
    out = tmp_path / "out"
    proc = run_cli(
        "shrink",
        torch_export.model_path,
        "--inputs",
        torch_export.inputs_path,
        "--target",
        target,
        "-o",
        str(out),
        "--json",
        "--max-calls",
        "12",
        timeout=600,
    )
    assert (out / "summary.json").exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    packs = summary["no_slippage"]["packs"]
    assert packs.startswith("one candidate per call"), packs
    assert "my runner feeds one input, this model has more" in packs


@needs_torch
@pytest.mark.parametrize("engine", ["emulate:fp16", "cmd"])
def test_every_model_a_run_builds_is_valid_and_runs_on_the_reference_engine(
    torch_export, tmp_path, monkeypatch, engine
):
    """Every model a target call of a run is given (survey packs, pairs, windows, the calibration
    pack, the probe, the final model): onnx's full check passes under the opsets it declares, and
    onnxruntime (the reference engine) runs it on the call's own feeds."""
    import onnxruntime as ort

    from reprokit.api import RunOptions
    from reprokit.engine.oracle import Oracle
    from reprokit.shrink.steps import shrink

    seen = []
    real = Oracle.run_target

    def checked(self, model_path, feeds, output_names=None):
        model = onnx.load(model_path)
        onnx.checker.check_model(model, full_check=True)
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        wanted = {i.name for i in session.get_inputs()}
        session.run(None, {k: np.asarray(v) for k, v in feeds.items() if k in wanted})
        seen.append(len(model.graph.node))
        return real(self, model_path, feeds, output_names)

    monkeypatch.setattr(Oracle, "run_target", checked)
    target = engine
    if engine == "cmd":
        script = tmp_path / "check.py"
        script.write_text(EMULATING_CHECK.format(log=str(tmp_path / "calls.log")))
        target = f"cmd:precision=fp16:{PY} {script} {{model}} {{inputs}} {{outputs}}"
    result = shrink(
        torch_export.model_path,
        target,
        str(tmp_path / "out"),
        options=RunOptions(inputs=torch_export.inputs_path),
        shrink_shapes=False,
    )
    assert result.summary["minimal"]["ops"] == ["Mul"]
    assert max(seen) > result.summary["original"]["nodes"]  # packs were among them
