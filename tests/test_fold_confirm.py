"""The confirming judgement folded into the survey's first packed call (issue 25,
confirm.FoldedConfirm): a numeric run's first call is the survey's, the original its first
member (the fp16 emulator, OpenVINO). An original that
agrees there stops as before after that one call; one that fails otherwise (here: a Reshape
whose shape, computed in fp16, no longer fits) is confirmed alone and the run goes on as a
pass/fail one — no call is made twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine.session import RunOptions
from reprokit.errors import NothingToReduce
from reprokit.shrink.budget import Limits
from reprokit.shrink.steps import shrink


def _reshape_by_count(width: int) -> onnx.ModelProto:
    """x[1,W] → Relu → Reshape to [count], count a float sum of W ones cast to int64: W = 2049 is
    not an fp16 number (2048), so under emulate:fp16 the Reshape fails to run."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Abs", ["r"], ["a"], name="abs"),
             helper.make_node("Add", ["a", "one"], ["a1"], name="add1"),
             helper.make_node("Sign", ["a1"], ["ones"], name="sign"),
             helper.make_node("ReduceSum", ["ones"], ["count"], keepdims=0, name="count"),
             helper.make_node("Unsqueeze", ["count", "axis"], ["count1"], name="unsq"),
             helper.make_node("Cast", ["count1"], ["shape"], to=TensorProto.INT64, name="cast"),
             helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
             helper.make_node("Neg", ["flat"], ["y"], name="neg")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [width])],
        initializer=[numpy_helper.from_array(np.array(1, np.float32), "one"),
                     numpy_helper.from_array(np.array([0], np.int64), "axis")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _steps(summary: dict) -> dict:
    return {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}


def test_an_original_that_fails_to_run_in_the_survey_pack_is_confirmed_alone(tmp_path):
    path = str(tmp_path / "reshape.onnx")
    onnx.save(_reshape_by_count(2049), path)
    said = []
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), on_event=said.append)
    summary = result.summary
    assert summary["status"] == "done" and summary["signature"]["kind"] == "build-error", summary["signature"]
    assert sorted(summary["minimal"]["node_names"]) == ["cast", "reshape"]
    # the survey's pack (the engine refused it as a whole), then the original alone: 2 calls at
    # confirm, the second the verdict the search holds to; nothing after it asks the original again
    assert _steps(summary)["confirm"] == 2, _steps(summary)
    assert summary["original_confirmed"].startswith("alone: the packed call that held it failed as a whole: it "
                                                    "showed build-error there"), summary["original_confirmed"]
    assert sum("confirming the divergence" in line for line in said) == 2, said


def test_an_original_that_agrees_in_the_survey_pack_stops_after_that_one_call(tmp_path):
    path = str(tmp_path / "reshape.onnx")
    onnx.save(_reshape_by_count(2048), path)  # 2048 is an fp16 number: nothing diverges
    said = []
    with pytest.raises(NothingToReduce, match="does not diverge under emulate:fp16"):
        shrink(path, "emulate:fp16", str(tmp_path / "out"), on_event=said.append)
    confirming = [line for line in said if "confirming the divergence" in line]
    assert confirming[-1] == "confirming the divergence (judged already, no call more)", said


def _overflowing(tmp_path) -> str:
    """The same model scaled past fp16's range (1e5·x)."""
    model = _reshape_by_count(2048)
    model.graph.node.insert(1, helper.make_node("Mul", ["r", "big"], ["r_big"], name="scale"))
    for node in model.graph.node[2:]:
        node.input[:] = ["r_big" if name == "r" else name for name in node.input]
    model.graph.initializer.append(numpy_helper.from_array(np.array(1e5, np.float32), "big"))
    path = str(tmp_path / "overflow.onnx")
    onnx.save(model, path)
    return path


def _openvino_fp16() -> str:
    try:
        import openvino
    except ImportError:
        return "openvino is not installed (pip install -e '.[openvino]')"
    if "FP16" not in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return "this CPU has no FP16 in OpenVINO's OPTIMIZATION_CAPABILITIES"
    return ""


@pytest.mark.skipif(bool(_openvino_fp16()), reason=_openvino_fp16() or "-")
def test_an_openvino_run_confirms_in_the_survey_pack(tmp_path):
    """OpenVINO may fuse inside a member (so its packs keep disjoint feeds), yet each member is
    its own copy: the original's verdict as the first member is its verdict alone, and the run
    makes no call of its own to confirm."""
    summary = shrink(_overflowing(tmp_path), "openvino:f16", str(tmp_path / "out")).summary
    assert summary["status"] == "done" and summary["signature"]["kind"] in ("nonfinite", "mismatch")
    assert "scale" in summary["minimal"]["node_names"], summary["minimal"]["node_names"]
    assert "confirm" not in _steps(summary) and summary["calls"]["target"] <= 3, _steps(summary)
    assert summary["original_confirmed"] == "the first member of the survey's packed call"


def test_a_numeric_run_on_the_emulator_confirms_in_the_survey_pack(tmp_path):
    """3 calls, none at confirm."""
    summary = shrink(_overflowing(tmp_path), "emulate:fp16", str(tmp_path / "out")).summary
    assert summary["status"] == "done" and summary["signature"]["kind"] in ("nonfinite", "mismatch")
    assert "scale" in summary["minimal"]["node_names"], summary["minimal"]["node_names"]
    assert "confirm" not in _steps(summary) and summary["calls"]["target"] <= 3, _steps(summary)
    assert summary["original_confirmed"].startswith("the first member of the survey's packed call")


def test_the_replay_rides_in_the_surveys_next_pack_when_the_memory_bound_splits_it(tmp_path):
    """--pack-memory 8M splits this sample's survey in two packs: the first holds the original's
    confirming judgement, the second its replay (--replays 1): no call of its own for either,
    4 calls in all (two survey packs, the shapes ladder, the crop alone)."""
    samples = Path(__file__).resolve().parent.parent / "samples"
    summary = shrink(str(samples / "attention_softmax_nan.onnx"), "emulate:fp16", str(tmp_path / "out"), replays=1,
                     options=RunOptions(inputs=str(samples / "attention_softmax_nan.inputs.npz")),
                     limits=Limits(pack_memory_bytes=8 << 20)).summary
    assert _steps(summary) == {"survey": 2, "shapes": 1, "final": 1}, _steps(summary)
    assert summary["original_replays"].endswith("one riding with the next packed call"), summary["original_replays"]
    assert summary["minimal"]["node_names"] == ["layer2/self0/attn/qk_matmul"]
