"""The verdict names the cause whatever its kind and wherever it sits (issue 38): each finding of
the review rebuilt from its own small model. Every test here failed at 21297fd and passes after."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import PY, run_cli
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


# --- 2. an overflow whose symptom is a finite mismatch ----------------------------------------

def exp_then_tanh_model() -> onnx.ModelProto:
    """x → Exp → Mul(1e-6) → Tanh → y: at x = 12 fp16's Exp gives Inf (e^12 = 162755 > 65504),
    so y is tanh(inf) = 1.0 instead of tanh(0.163) = 0.161: a finite mismatch caused by an Inf."""
    scale = numpy_helper.from_array(np.full((8,), 1e-6, np.float32), "s")
    return _model([helper.make_node("Exp", ["x"], ["e"], name="exp"),
                   helper.make_node("Mul", ["e", "s"], ["m"], name="scale"),
                   helper.make_node("Tanh", ["m"], ["y"], name="tanh")],
                  [_value("x", [8])], [_value("y", [8])], [scale])


def test_an_inf_that_ends_as_a_finite_mismatch_is_the_cause(tmp_path):
    onnx.save(exp_then_tanh_model(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.full((8,), 12.0, np.float32))
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "-o", str(out), "--no-pack")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    assert summary["status"] == "done", summary.get("note")
    assert summary["signature"]["kind"] == "mismatch"
    assert summary["minimal"]["node_names"] == ["exp"], summary["minimal"]
    # counted from the outcomes: the accepted candidate and the final judgement were injected
    assert summary["no_slippage"]["accepted"] == {"shows it: causal test": 1}, summary["no_slippage"]
    # the final judgement: injected too, or (a crop of the Exp) held to the Inf the Exp showed
    assert summary["no_slippage"]["final"] in ("shows it: causal test", "shows it: signature only (a shape crop)")
    assert "cause the original's mismatch" in proc.stdout


# --- 1. inside control flow the causal test runs too ------------------------------------------

FP16_WHILE_IF_CHECK = """\
# an engine whose fp16 storage is used only while the model holds an If (opened, it runs fp32)
import sys, numpy as np, onnx, onnxruntime as ort
from reprokit.standalone.emulation import emulate_model
model_path, inputs, outputs = sys.argv[1:4]
model = onnx.load(model_path)
if any(n.op_type == "If" for n in model.graph.node):
    model = emulate_model(model, "fp16", frozenset())
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
feeds = dict(np.load(inputs))
values = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
np.savez(outputs, **dict(zip([o.name for o in session.get_outputs()], values)))
"""


def masked_in_if_model() -> onnx.ModelProto:
    """flag → Greater(0) → c; If(c):
         then: x1 → Mul(1e5) b_mul → Clip(±10) → y1   (fp16 Inf, hidden by the Clip)
               x2 → Mul(1e5) e_mul → e → Sub(e, e) → y2  (fp16 Inf, then inf - inf = NaN: the bug)
         else: y1 = x1, y2 = x2"""
    big = numpy_helper.from_array(np.full((64,), 1e5, np.float32), "w")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((-10.0, "lo"), (10.0, "hi"), (0.0, "zero"))]
    then = helper.make_graph([helper.make_node("Mul", ["x1", "w"], ["b"], name="b_mul"),
                              helper.make_node("Clip", ["b", "lo", "hi"], ["t1"], name="clip"),
                              helper.make_node("Mul", ["x2", "w"], ["e"], name="e_mul"),
                              helper.make_node("Sub", ["e", "e"], ["t2"], name="sub")],
                             "then", [], [_value("t1", [64]), _value("t2", [64])])
    other = helper.make_graph([helper.make_node("Identity", ["x1"], ["o1"], name="else/id1"),
                               helper.make_node("Identity", ["x2"], ["o2"], name="else/id2")],
                              "else", [], [_value("o1", [64]), _value("o2", [64])])
    return _model([helper.make_node("Greater", ["flag", "zero"], ["c"], name="gt"),
                   helper.make_node("If", ["c"], ["y1", "y2"], name="branch", then_branch=then, else_branch=other)],
                  [_value("x1", [64]), _value("x2", [64]), _value("flag", [])],
                  [_value("y1", [64]), _value("y2", [64])], [big, *consts])


def test_inside_an_if_a_nan_bug_reduces_to_its_cause_and_the_summary_counts_the_test(tmp_path):
    onnx.save(masked_in_if_model(), str(tmp_path / "m.onnx"))
    check = tmp_path / "fp16_while_if.py"
    check.write_text(FP16_WHILE_IF_CHECK)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", x1=rng.uniform(1.5, 2, 64).astype(np.float32),
             x2=rng.uniform(1.5, 2, 64).astype(np.float32), flag=np.array(1.0, np.float32))
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", f"cmd:{PY} {check} {{model}} {{inputs}} {{outputs}}",
                   "--inputs", str(tmp_path / "x.npz"), "-o", str(out), "--no-pack", "--no-shrink-shapes")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    assert summary["signature"] == {"kind": "nonfinite", "outputs": ["y2"], "detail": "nan"}
    assert "each candidate kept inside an If" in proc.stdout  # the opening's space: wrapped candidates
    minimal = onnx.load(str(out / "minimal.onnx"))
    inner = {n.name for node in minimal.graph.node for a in node.attribute if a.name == "then_branch" for n in a.g.node}
    # the minimal lies in y2's cone: the clipped Mul's Inf never reaches y2
    assert inner and inner <= {"e_mul", "sub"}, inner
    assert summary["no_slippage"]["test"] == "causal injection", summary["no_slippage"]
    assert summary["no_slippage"]["rejected"] >= 1  # b_mul looked like the bug and was injected


# --- 3. the isolated attribution judges every node --------------------------------------------

def int_accumulator_model() -> onnx.ModelProto:
    """x:int32 → Add(k = 5000) accumulate → acc:int32 → Cast(float) to_float → Mul(1e-3) → y: the
    int32 accumulator passes 65504, so fp16 storage of the Cast's output is Inf (the Mul, fed that
    value, is a cut fp16 cannot hold)."""
    return _model([helper.make_node("Add", ["x", "k"], ["acc"], name="accumulate"),
                   helper.make_node("Cast", ["acc"], ["c"], name="to_float", to=TensorProto.FLOAT),
                   helper.make_node("Mul", ["c", "s"], ["y"], name="scale")],
                  [_value("x", [8], TensorProto.INT32)], [_value("y", [8])],
                  [numpy_helper.from_array(np.full((8,), 5000, np.int32), "k"),
                   numpy_helper.from_array(np.full((8,), 1e-3, np.float32), "s")])


def constant_model() -> onnx.ModelProto:
    """Constant(70000) big → c; x → Mul(x, c) scale → y: fp16 holds the constant as 65504 (a weight
    is clamped), so y is 6 % off — the divergence is born in the node with no inputs."""
    value = numpy_helper.from_array(np.full((8,), 70000.0, np.float32))
    return _model([helper.make_node("Constant", [], ["c"], name="big", value=value),
                   helper.make_node("Mul", ["x", "c"], ["y"], name="scale")],
                  [_value("x", [8])], [_value("y", [8])])


@pytest.mark.parametrize(("model", "feed", "born"), [
    (int_accumulator_model, np.arange(65000, 65008, dtype=np.int32), "to_float"),
    (constant_model, np.full((8,), 1e-3, np.float32), "big"),
], ids=["int-reading-cast", "constant"])
def test_layerwise_judges_constants_and_nodes_that_read_integers(tmp_path, model, feed, born):
    onnx.save(model(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=feed)
    proc = run_cli("check", str(tmp_path / "m.onnx"), "-t", "emulate:fp16", "--inputs", str(tmp_path / "x.npz"),
                   "--layerwise", "--json")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    start = json.loads(proc.stdout)["layerwise"]["start"]
    assert (start["kind"], start["node"]) == ("local", born), start


# --- 4. a constant cause with an infinite reference packs, and says what it depends on --------

def masked_attention_model() -> onnx.ModelProto:
    """Constant(-inf) min_value → Where(mask, 0, -inf) → bias; scores + bias → Softmax → p;
    Where(IsNaN(p), 0, p) → y — transformers' padded attention: a fully masked row is NaN, then 0.
    fp16 storage clamps the constant to -65504, so that row becomes uniform (0.25) instead of 0."""
    minimum = numpy_helper.from_array(np.array(-np.inf, np.float32))
    return _model([helper.make_node("Constant", [], ["ninf"], name="min_value", value=minimum),
                   helper.make_node("Where", ["mask", "zero", "ninf"], ["bias"], name="mask_bias"),
                   helper.make_node("Add", ["scores", "bias"], ["s"], name="add_bias"),
                   helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
                   helper.make_node("IsNaN", ["p"], ["isnan"], name="isnan"),
                   helper.make_node("Where", ["isnan", "zero", "p"], ["y"], name="guard")],
                  [_value("scores", [3, 4]), _value("mask", [3, 4], TensorProto.BOOL)], [_value("y", [3, 4])],
                  [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])


def test_a_constant_cause_whose_reference_is_inf_packs_reproduces_and_names_the_emulation_choice(tmp_path):
    onnx.save(masked_attention_model(), str(tmp_path / "m.onnx"))
    mask = np.ones((3, 4), bool)
    mask[0, :], mask[1, :2] = False, False
    np.savez(tmp_path / "x.npz", scores=np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), mask=mask)
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "-o", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    assert summary["status"] == "done" and summary["minimal"]["node_names"] == ["min_value"], summary["minimal"]
    assert "emulation choice" in summary["emulation_choice"] and "emulation choice" in proc.stdout
    assert summary["report_reproduces"] is True, summary.get("report")
    # the minimal, checked as printed: its reference is -inf, compared exactly there
    again = run_cli("check", str(out / "minimal.onnx"), "-t", "emulate:fp16", "--inputs", str(out / "inputs.npz"),
                    "--json")
    assert again.returncode == 1, again.stdout[-2000:] + again.stderr[-2000:]
    (output,) = json.loads(again.stdout)["verdict"]["outputs"]
    assert output["reference_inf"] == 1 and output["exceeds"]
    import tarfile

    with tarfile.open(out / "report.tar.gz") as archive:
        issue = next(m for m in archive.getmembers() if m.name.endswith("/ISSUE.md"))
        assert "emulation choice" in archive.extractfile(issue).read().decode()


# --- the property: a minimal reprokit wrote shrinks to itself ---------------------------------

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SAMPLE_NAMES = [e["name"] for e in json.loads((SAMPLES / "catalog.json").read_text())["samples"]]
REGRESSIONS = {
    "exp-tanh": (exp_then_tanh_model, {"x": np.full((8,), 12.0, np.float32)}),
    "int-accumulator": (int_accumulator_model, {"x": np.arange(65000, 65008, dtype=np.int32)}),
    "constant": (constant_model, {"x": np.full((8,), 1e-3, np.float32)}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLE_NAMES + list(REGRESSIONS))
def test_shrinking_a_minimal_reprokit_wrote_returns_the_same_minimal(tmp_path, name):
    """Idempotence: the minimal model of a run, shrunk again with its own inputs, is that model
    (the same nodes): a second run finds no other cause inside the first one's answer."""
    from reprokit.api import RunOptions
    from reprokit.shrink.steps import shrink

    if name in REGRESSIONS:
        make, feeds = REGRESSIONS[name]
        onnx.save(make(), str(tmp_path / "m.onnx"))
        np.savez(tmp_path / "x.npz", **feeds)
        model, inputs = str(tmp_path / "m.onnx"), str(tmp_path / "x.npz")
    else:
        model, inputs = str(SAMPLES / f"{name}.onnx"), str(SAMPLES / f"{name}.inputs.npz")
    first = shrink(model, "emulate:fp16", str(tmp_path / "first"), options=RunOptions(inputs=inputs))
    assert first.summary["status"] == "done", first.summary.get("note")
    again = shrink(first.minimal_path, "emulate:fp16", str(tmp_path / "again"),
                   options=RunOptions(inputs=str(tmp_path / "first" / "inputs.npz")))
    assert again.summary["status"] == "done", again.summary.get("note")
    assert sorted(again.summary["minimal"]["node_names"]) == sorted(first.summary["minimal"]["node_names"])


# --- 2b. an accumulated error beside a node that diverges alone: one story --------------------

def mlp_beside_a_cancellation_model() -> onnx.ModelProto:
    """x → Add(256) shift → Sub(256) unshift → Mul(0) times_zero → Add(x, ·) join → 24 × (MatMul →
    Tanh): bf16 loses x's digits next to 256, so unshift diverges alone (its value never reaches
    t23: times zero), while t23's mismatch is the MLP's accumulated bf16 error."""
    from test_precision import accumulating_mlp

    model = accumulating_mlp()
    next(n for n in model.graph.node if n.name == "mm0").input[0] = "x0"
    side = [helper.make_node("Add", ["x", "c256"], ["shifted"], name="shift"),
            helper.make_node("Sub", ["shifted", "c256"], ["back"], name="unshift"),
            helper.make_node("Mul", ["back", "zero"], ["nothing"], name="times_zero"),
            helper.make_node("Add", ["x", "nothing"], ["x0"], name="join")]
    nodes = side + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(256.0, np.float32), "c256"),
                                    numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    return model


@pytest.mark.slow
def test_an_accumulated_error_says_which_node_diverges_alone_as_layerwise_does(tmp_path):
    onnx.save(mlp_beside_a_cancellation_model(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    common = ["-t", "emulate:bf16", "--tol", "0.01", "--inputs", str(tmp_path / "x.npz")]
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), *common, "-o", str(tmp_path / "out"), "--no-pack")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(tmp_path / "out")
    assert summary["status"] == "accumulated" and summary["attribution"]["diverging_alone"] == 1
    start = summary["attribution"]["divergence_start"]
    # never "no node diverges on its own" beside a table where one does
    assert (start["kind"], start["node"]) == ("local", "unshift"), start
    check = run_cli("check", str(tmp_path / "m.onnx"), *common, "--layerwise", "--json")
    assert check.returncode == 1, check.stderr[-2000:]
    assert json.loads(check.stdout)["layerwise"]["start"]["node"] == "unshift"


# --- 6. sufficient is not necessary: said where it is free ------------------------------------

def two_overflows_model() -> onnx.ModelProto:
    """x1 → Mul(1e5) a_mul → a; x2 → Mul(1e5) b_mul → b; a + b → y: each Mul overflows fp16 on its
    own and either Inf alone makes y Inf — keeping one of them in fp32 fixes nothing."""
    big = numpy_helper.from_array(np.full((64,), 1e5, np.float32), "w")
    return _model([helper.make_node("Mul", ["x1", "w"], ["a"], name="a_mul"),
                   helper.make_node("Mul", ["x2", "w"], ["b"], name="b_mul"),
                   helper.make_node("Add", ["a", "b"], ["y"], name="add")],
                  [_value("x1", [64]), _value("x2", [64])], [_value("y", [64])], [big])


def test_a_sufficient_cause_that_is_not_the_fix_says_so(tmp_path):
    onnx.save(two_overflows_model(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", x1=rng.uniform(1.5, 2, 64).astype(np.float32),
             x2=rng.uniform(1.5, 2, 64).astype(np.float32))
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "-o", str(out), "--no-shrink-shapes")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(out)
    (kept,) = summary["minimal"]["node_names"]
    other = ({"a_mul", "b_mul"} - {kept}).pop()
    assert summary["fixes_alone"]["answer"] == "no" and summary["fixes_alone"]["other_causes"] == [other]
    assert "fixing this alone does not fix the model" in proc.stdout
    # one cause only: never "no"
    onnx.save(exp_then_tanh_model(), str(tmp_path / "one.onnx"))
    np.savez(tmp_path / "one.npz", x=np.full((8,), 12.0, np.float32))
    proc = run_cli("shrink", str(tmp_path / "one.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "one.npz"), "-o", str(tmp_path / "one"), "--no-pack")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert _summary(tmp_path / "one")["fixes_alone"]["answer"] != "no"


# --- 5. compare what the user reads: padded positions left out --------------------------------

def test_padded_positions_left_out_of_the_comparison_agree(tmp_path):
    """The masked attention model: the fully masked row 0 is the only difference (uniform 0.25
    instead of 0); a mask derived from the attention mask leaves it out, and the model agrees."""
    onnx.save(masked_attention_model(), str(tmp_path / "m.onnx"))
    mask = np.ones((3, 4), bool)
    mask[0, :], mask[1, :2] = False, False
    np.savez(tmp_path / "x.npz", scores=np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), mask=mask)
    np.savez(tmp_path / "pad.npz", y=~mask.any(axis=1, keepdims=True))  # rows nobody reads
    np.savez(tmp_path / "bad.npz", y=np.zeros((3, 4)))
    common = ["check", str(tmp_path / "m.onnx"), "-t", "emulate:fp16", "--inputs", str(tmp_path / "x.npz")]
    assert run_cli(*common).returncode == 1
    proc = run_cli(*common, "--ignore-positions", str(tmp_path / "pad.npz"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    bad = run_cli(*common, "--ignore-positions", str(tmp_path / "bad.npz"))
    assert bad.returncode == 3 and bad.stderr.count("Error:") == 1 and "Hint:" in bad.stderr, bad.stderr
