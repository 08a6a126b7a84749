"""Issue 36: the table of TensorRT facts per version (reprokit/engine/backends/trt_versions.py)
against NVIDIA's documented removals, and the refusals read from it: INT8/FP8 on a model without
Q/DQ where only explicit quantization exists, strongly-typed and bf16 on 8.6. The refusal runs for
real through the CLI with TensorRT-RTX asked for (POLYGRAPHY_USE_TENSORRT_RTX=1): its facts need
no TensorRT installed.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine.backends.trt_setup import builder_settings, has_qdq, refuse_unbuildable
from reprokit.engine.backends.trt_versions import FACTS, Typing, facts_for, supported
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.spec import parse_target

# TensorRT 10.x→11.x migration guide, "Removed Python APIs and Replacements" and the trtexec page
REMOVED_IN_11 = {"FP16", "BF16", "INT8", "FP8"}
TRTEXEC_REMOVED_IN_11 = {"--fp16", "--bf16", "--int8", "--fp8", "--best"}


@pytest.mark.parametrize(
    ("version", "key"),
    [
        ("8.6.1.6", "8.6"),
        ("10.0.1.6", "10.0-10.11"),
        ("10.11.0", "10.0-10.11"),
        ("10.12.0.36", "10.12+"),
        ("10.13.3", "10.12+"),
        ("11.0.0", "11"),
        ("11.4.0.9", "11"),
    ],
)
def test_each_version_finds_its_line(version, key):
    assert facts_for(version).key == key
    assert facts_for(version, rtx=True).key == "rtx"


def test_the_table_matches_nvidias_documented_removals():
    eleven = facts_for("11.4")
    assert eleven.default_typing is Typing.STRONG and not eleven.weak_typing
    assert not set(eleven.precision_flags) & REMOVED_IN_11
    assert not set(eleven.trtexec_precision) & TRTEXEC_REMOVED_IN_11
    assert not eleven.calibrators and not eleven.layer_precisions
    ten = facts_for("10.13")
    assert set(ten.precision_flags) == REMOVED_IN_11 and ten.weak_deprecated  # deprecated in 10.12
    assert not facts_for("10.11").weak_deprecated
    old = facts_for("8.6")
    assert (
        "BF16" not in old.precision_flags and not old.strongly_typed_flag and not old.debug_tensors
    )
    assert all(f.debug_tensors for f in FACTS if f.key != "8.6")  # mark_debug: TensorRT 10.0
    assert facts_for(None, rtx=True).default_typing is Typing.STRONG
    assert not supported("8.5.3") and supported("8.6.1") and supported(None, rtx=True)


@pytest.mark.parametrize("version", ["11.4.0", "10.13.0"])
def test_settings_come_from_the_table(version):
    s = builder_settings(parse_target("trt:fp16"), version, False)
    facts = facts_for(version)
    assert s.facts == facts.key
    assert (s.mode == "weakly-typed") == facts.weak_typing
    assert (s.convert_to == "fp16") == (not facts.weak_typing)


def test_8_6_refuses_what_it_does_not_have():
    with pytest.raises(EngineUnavailable, match="strongly typed") as caught:
        builder_settings(parse_target("trt:strongly-typed,fp16"), "8.6.1", False)
    assert caught.value.hint
    with pytest.raises(EngineUnavailable, match="BF16"):
        builder_settings(parse_target("trt:bf16"), "8.6.1", False)
    assert builder_settings(parse_target("trt:bf16"), "10.0.1", False).create_config["bf16"] is True


def test_int8_without_qdq_is_refused_where_only_explicit_quantization_exists():
    for facts in (facts_for("11.0"), facts_for(None, rtx=True)):
        with pytest.raises(UsageError, match="without Q/DQ") as caught:
            refuse_unbuildable(parse_target("trt:int8"), facts, has_qdq=False)
        assert "quantize_static" in caught.value.hint and "ModelOpt" in caught.value.hint
        refuse_unbuildable(parse_target("trt:int8"), facts, has_qdq=True)  # a Q/DQ model builds
    with pytest.raises(UsageError, match="without Q/DQ"):  # strongly-typed on 10 is the same
        refuse_unbuildable(
            parse_target("trt:strongly-typed,int8"), facts_for("10.13"), has_qdq=False
        )
    with pytest.raises(UsageError, match="no FP8 calibrator"):
        refuse_unbuildable(parse_target("trt:fp8"), facts_for("10.13"), has_qdq=False)


def test_weak_int8_without_qdq_calibrates_like_the_printed_polygraphy_command():
    s = builder_settings(parse_target("trt:int8"), "10.13.0", False, has_qdq=False)
    assert s.calibrate and s.create_config["int8"] is True
    assert any("calibrat" in n for n in s.notes)
    assert not builder_settings(parse_target("trt:int8"), "10.13.0", False, has_qdq=True).calibrate
    assert not builder_settings(parse_target("trt:fp16"), "10.13.0", False, has_qdq=False).calibrate
    # the backend's call binds to polygraphy's real loaders (what `polygraphy run --int8` builds)
    import inspect

    from polygraphy.backend.trt import Calibrator, CreateConfig

    inspect.signature(CreateConfig).bind(**s.create_config, calibrator=None)
    inspect.signature(Calibrator).bind(data_loader=[{"x": None}])


def _float_model(path, qdq: bool):
    # x[1,8] ─(QuantizeLinear─DequantizeLinear)?─ Relu ─ y
    nodes, inits, src = [], [], "x"
    if qdq:
        inits = [
            numpy_helper.from_array(np.array(0.05, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "z"),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"),
        ]
        src = "dq"
    nodes.append(helper.make_node("Relu", [src], ["y"], name="relu"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model


def test_has_qdq(tmp_path):
    assert has_qdq(_float_model(tmp_path / "q.onnx", True))
    assert not has_qdq(_float_model(tmp_path / "f.onnx", False))


@pytest.mark.parametrize("command", ["check", "shrink", "audit"])
def test_trt_int8_on_a_float_model_is_refused_before_any_run(tmp_path, command):
    """TensorRT-RTX (strongly typed only): trt:int8 on a model without Q/DQ is exit 2 with the words
    that say why and what to do; never an INT8 verdict on an engine built in float."""
    _float_model(tmp_path / "f.onnx", False)
    env = {"POLYGRAPHY_USE_TENSORRT_RTX": "1"}
    extra = ["-o", str(tmp_path / "out")] if command != "check" else []
    proc = run_cli(command, "f.onnx", "--target", "trt:int8", *extra, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (
        "without Q/DQ nodes" in proc.stderr and "Hint:" in proc.stderr and "quantize" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_trt_int8_on_a_qdq_model_goes_on_to_the_engine(tmp_path):
    _float_model(tmp_path / "q.onnx", True)
    env = {"POLYGRAPHY_USE_TENSORRT_RTX": "1"}
    proc = run_cli("check", "q.onnx", "--target", "trt:int8", cwd=tmp_path, env=env)
    assert proc.returncode == 4, (
        proc.stdout + proc.stderr
    )  # no TensorRT-RTX here: the engine is missing
    assert "Q/DQ" not in proc.stderr


def test_docs_cli_holds_the_table_as_the_code_writes_it():
    from pathlib import Path

    from reprokit.engine.backends.trt_versions import markdown_table

    docs = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    assert markdown_table() in docs


class FakeTensor:
    """Stands in for a TensorRT tensor: only a name (the marking logic is under test, not TensorRT)."""

    def __init__(self, name):
        self.name = name


class FakeLayer:
    def __init__(self, tensors):
        self.tensors = tensors
        self.num_outputs = len(tensors)

    def get_output(self, i):
        return self.tensors[i]


class FakeNetwork:
    """A stand-in for TensorRT's INetworkDefinition with the calls marking uses (one layer making
    every tensor); ``debug``: it has mark_debug (TensorRT >= 10) or not (8.6)."""

    num_inputs = 0

    def __init__(self, names, debug: bool):
        self.tensors = [FakeTensor(n) for n in names]
        self.outputs, self.debug_marked = [self.tensors[-1]], []
        if debug:
            self.mark_debug = lambda tensor: self.debug_marked.append(tensor.name)

    def __iter__(self):
        return iter([FakeLayer(self.tensors)])

    @property
    def num_outputs(self):
        return len(self.outputs)

    def get_output(self, i):
        return self.outputs[i]

    def unmark_output(self, tensor):
        self.outputs.remove(tensor)

    def mark_output(self, tensor):
        self.outputs.append(tensor)


def test_layerwise_observes_through_debug_tensors_where_they_exist(tmp_path):
    from reprokit.engine.backends import trt as trt_backend
    from reprokit.graph.model import OBSERVE_KEY, mark_outputs

    model = mark_outputs(_float_model(tmp_path / "f.onnx", True), ["q", "dq"])
    assert (
        trt_backend._observed(model, ["q", "dq", "y"]) == set()
    )  # not a layerwise model: plain outputs
    model.metadata_props.add(key=OBSERVE_KEY, value="layerwise")
    observed = trt_backend._observed(model, ["q", "dq", "y"])
    assert observed == {"q", "dq"}  # y is the model's own output, read by no node
    for debug in (True, False):
        network, meta = FakeNetwork(["q", "dq", "y"], debug), {}
        trt_backend._mark_exactly(["q", "dq", "y"], observed, meta)(network)
        outputs = sorted(t.name for t in network.outputs)
        if debug:  # read as debug tensors, only the model's own output stays a network output
            assert outputs == ["y"] and sorted(network.debug_marked) == ["dq", "q"]
            assert "debug tensors" in meta["observed_by"]
        else:  # TensorRT 8.6: marked as outputs, and said
            assert outputs == ["dq", "q", "y"] and "no debug tensors" in meta["observed_by"]
