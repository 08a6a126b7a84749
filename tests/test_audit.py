"""``reprokit audit`` with real engines: the range audit names a planted fault with no target
call, the weights audit flags a BatchNormalization variance past fp16, the LayerNorm rewrite is
numerically equivalent on onnxruntime fp32, the sweep on a sample keeps the fault node in fp32,
explain tells data from weights, and the CLI writes every file, prints JSON and fails cleanly."""

from __future__ import annotations

import json
import os
import tarfile

import models
import numpy as np
import onnx
import pytest
from conftest import REPO, assert_user_error
from onnx import helper

from reprokit.api import RunOptions
from reprokit.audit import audit
from reprokit.audit.layernorm import fuse_layernorms
from reprokit.audit.ranges import suspects_from_ranges

SAMPLES = REPO / "samples"
CATALOG = {s["name"]: s for s in json.loads((SAMPLES / "catalog.json").read_text())["samples"]}


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def batchnorm_big_variance() -> onnx.ModelProto:
    """A BatchNormalization whose running variance (1e6) is past fp16's 65504."""
    # x[1,4,8,8] -> Conv(1x1) "conv" -> BatchNormalization(var = 1e6) "bn" -> Relu "relu" -> y
    rng = np.random.default_rng(3)
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
         helper.make_node("Relu", ["b"], ["y"], name="relu")],
        [models.vi("x", [1, 4, 8, 8])], [models.vi("y", [1, 4, 8, 8])],
        [models.const("w", rng.uniform(-1, 1, (4, 4, 1, 1))), models.const("scale", np.full(4, 500.0)),
         models.const("bias", np.full(4, 0.1)), models.const("mean", np.zeros(4)),
         models.const("var", np.full(4, 1e6))],
    )


def decomposed_layernorm(axes, shape, *, opset=17, square="pow") -> onnx.ModelProto:
    """LayerNorm exported as primitives, then a Relu."""
    # x -> ReduceMean(axes) -> Sub -> Pow(2)|Mul(d,d) -> ReduceMean -> Add(eps) -> Sqrt -> Div
    #   -> Mul(gamma) -> Add(beta) -> Relu -> y
    rng = np.random.default_rng(4)
    param = [1] * len(shape)
    for a in axes:
        param[a] = shape[a]
    inits = [models.const("two", np.float32(2.0)), models.const("eps", np.float32(1e-5)),
             models.const("gamma", rng.uniform(0.5, 1.5, param)), models.const("beta", rng.uniform(-0.2, 0.2, param))]

    def reduce(name, src, out):
        if opset >= 18:
            return helper.make_node("ReduceMean", [src, "axes"], [out], name=name, keepdims=1)
        return helper.make_node("ReduceMean", [src], [out], name=name, axes=list(axes), keepdims=1)

    if opset >= 18:
        inits.append(onnx.numpy_helper.from_array(np.asarray(axes, dtype=np.int64), "axes"))
    squared = (helper.make_node("Pow", ["d", "two"], ["d2"], name="ln/pow") if square == "pow"
               else helper.make_node("Mul", ["d", "d"], ["d2"], name="ln/square"))
    return _model(
        [reduce("ln/mean", "x", "mu"), helper.make_node("Sub", ["x", "mu"], ["d"], name="ln/sub"), squared,
         reduce("ln/var", "d2", "var"), helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/add_eps"),
         helper.make_node("Sqrt", ["ve"], ["std"], name="ln/sqrt"),
         helper.make_node("Div", ["d", "std"], ["n"], name="ln/div"),
         helper.make_node("Mul", ["n", "gamma"], ["g"], name="ln/mul"),
         helper.make_node("Add", ["g", "beta"], ["ln_out"], name="ln/add"),
         helper.make_node("Relu", ["ln_out"], ["y"], name="after")],
        [models.vi("x", list(shape))], [models.vi("y", list(shape))], inits, opset=opset,
    )


def spike_bias(n: int = 256) -> onnx.ModelProto:
    """One bias entry of 1e5 among zeros: any input overflows fp16 there; random weights with
    the same mean and std (max ~2e4) do not."""
    # x[1,n] -> Add(B: zeros, B[7] = 1e5) "spike" -> Relu -> y
    bias = np.zeros(n)
    bias[7] = 1e5
    return models.make([helper.make_node("Add", ["x", "B"], ["h"], name="spike"),
                        helper.make_node("Relu", ["h"], ["y"], name="relu")],
                       [models.vi("x", [1, n])], [models.vi("y", [1, n])], [models.const("B", bias)])


def flat_scale(n: int = 256) -> onnx.ModelProto:
    """x * 1000 everywhere: overflows fp16 only where an input passes 65.5."""
    # x[1,n] -> Mul(W = 1000 * ones) "scale" -> y
    return models.make([helper.make_node("Mul", ["x", "W"], ["y"], name="scale")],
                       [models.vi("x", [1, n])], [models.vi("y", [1, n])], [models.const("W", np.full(n, 1000.0))])


def _ort(model, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_range_audit_names_the_planted_overflow_with_no_target_call(tmp_path, model_file):
    path = model_file("planted_overflow")
    result = audit(path, "emulate:fp16", str(tmp_path / "out"), ranges_only=True)
    first = result.ranges.first
    assert (first.node, first.finding) == ("boom", "overflow")
    assert [r.node for r in result.ranges.flagged] == ["boom"]
    assert result.payload["cost"]["target_calls"] == 0
    assert [c["role"] for c in result.payload["calls"]] == ["reference"]
    # trt:fp16 needs no TensorRT here: the range audit builds no engine
    again = audit(path, "trt:fp16", None, ranges_only=True)
    assert again.ranges.first.node == "boom" and again.payload["cost"]["target_calls"] == 0


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_range_audit_of_each_sample_names_its_planted_fault_first(name):
    sample = CATALOG[name]
    options = RunOptions(inputs=str(SAMPLES / sample["inputs"]))
    result = audit(str(SAMPLES / sample["file"]), "emulate:fp16", None, options=options, ranges_only=True)
    assert result.ranges.first.node == sample["fault_node"] or result.ranges.first.node in sample["keep_fp32"]
    # what the sweep would keep in fp32: the overflowing run, or the producer of a cancelled value
    region = suspects_from_ranges(onnx.load(SAMPLES / sample["file"]), result.ranges)
    assert region and set(region) <= set(sample["keep_fp32"]) | {sample["fault_node"]}


def test_weights_audit_flags_a_batchnorm_variance_past_fp16(tmp_path):
    path = models.save(batchnorm_big_variance(), tmp_path / "bn.onnx")
    result = audit(path, "emulate:fp16", None, ranges_only=True)
    flagged = {w.tensor: w for w in result.ranges.weights}
    assert flagged["var"].finding == "overflow"
    assert flagged["var"].consumers == ["bn (BatchNormalization input 'input_var')"]
    assert "bias" not in flagged and "mean" not in flagged
    assert result.payload["weights"]["flagged"][0]["tensor"] == "var"
    bf16 = audit(path, "emulate:bf16", None, ranges_only=True)
    assert bf16.ranges.weights == []


@pytest.mark.parametrize("axes,shape,opset,square", [
    ([-1], [2, 5, 16], 17, "pow"),  # trailing axis, as torch exports nn.LayerNorm
    ([1], [1, 8, 4, 4], 17, "pow"),  # channel LayerNorm on NCHW (NAFNet): Transposes around
    ([2], [2, 3, 12], 13, "mul"),  # opset 13, Mul(d, d): converted to opset 17 first
    ([-2, -1], [2, 6, 5], 18, "pow"),  # opset 18: ReduceMean takes its axes as an input
])
def test_layernorm_rewrite_is_equivalent_and_smaller(axes, shape, opset, square):
    model = decomposed_layernorm(axes, shape, opset=opset, square=square)
    fused, matches = fuse_layernorms(model)
    assert len(matches) == 1 and matches[0].affine
    assert [n.op_type for n in fused.graph.node].count("LayerNormalization") == 1
    assert len(fused.graph.node) < len(model.graph.node)
    assert matches[0].transposed == (axes == [1])
    feeds = {"x": np.random.default_rng(5).normal(3.0, 2.0, shape).astype(np.float32)}
    (want,), (got,) = _ort(model, feeds), _ort(fused, feeds)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_layernorm_rewrite_leaves_other_graphs_alone(model_file):
    model = onnx.load(model_file("small_mlp"))
    same, matches = fuse_layernorms(model)
    assert matches == [] and same is model


def test_sweep_on_a_sample_keeps_the_fault_node_in_fp32(tmp_path):
    sample = CATALOG["static_batch_broadcast"]
    options = RunOptions(inputs=str(SAMPLES / sample["inputs"]))
    result = audit(str(SAMPLES / sample["file"]), "emulate:fp16", str(tmp_path / "out"), options=options,
                   explain_inputs=False)
    found = result.workaround
    assert found["key"] == "fp32-nodes" and found["verdict"] == "agree"
    kept = found["setting"].split("fp32-nodes=", 1)[1].split(";")
    assert set(kept) <= set(sample["keep_fp32"]) | {sample["fault_node"]}
    by_key = {r.key: r for r in result.sweep}
    # plain fp32 is the reference itself: never offered as a workaround, no call spent on it
    assert by_key["fp32"].setting == "ort (the reference)" and by_key["fp32"].verdict == "not applicable"
    assert not by_key["fp32"].fixes and by_key["fp32"].target_calls == 0
    assert by_key["no-tf32"].verdict == "not applicable" and by_key["batch"].verdict == "not applicable"
    ranks = [r.rank for r in result.sweep]
    assert ranks == sorted(ranks)
    # every engine call is listed with its cost; the range audit added none
    cost = result.payload["cost"]
    assert cost["target_calls"] == sum(1 for c in result.payload["calls"] if c["role"] == "target")
    # the verdict, the marked layerwise run, every node alone (packed: one call), the sweep
    assert result.payload["isolated"]["calls"] == 1
    assert result.payload["isolated"]["nodes_judged_alone"] >= 50
    assert cost["target_calls"] == 2 + 1 + sum(r.target_calls for r in result.sweep)


def test_sweep_fuses_the_layernorm_of_the_nafnet_sample(tmp_path):
    sample = CATALOG["layernorm_overflow"]
    options = RunOptions(inputs=str(SAMPLES / sample["inputs"]))
    result = audit(str(SAMPLES / sample["file"]), "emulate:fp16", None, options=options, explain_inputs=False)
    rows = {r.key: r for r in result.sweep}
    assert rows["layernorm"].fixes and "rel L2" in rows["layernorm"].note
    assert rows["layernorm"].reference_calls == 1  # the rewritten model's reference, checked equal
    assert result.workaround["key"] == "fp32-nodes"  # 3 nodes in fp32 is the smaller change
    assert set(result.workaround["setting"].split("=", 1)[1].split(";")) == set(sample["keep_fp32"])


def test_explain_tells_weights_from_data(tmp_path):
    path = models.save(spike_bias(), tmp_path / "spike.onnx")
    weights = audit(path, "emulate:fp16", None, sweep=False)
    explained = weights.payload["explain"]
    assert explained["random_inputs"]["diverges"] and not explained["random_weights"]["diverges"]
    assert explained["conclusion"].startswith("weights")

    path = models.save(flat_scale(), tmp_path / "scale.onnx")
    x = np.random.default_rng(6).uniform(0, 0.01, (1, 256)).astype(np.float32)
    x[0, 3] = 100.0  # 100 * 1000 > 65504
    np.savez(tmp_path / "x.npz", x=x)
    data = audit(path, "emulate:fp16", None, options=RunOptions(inputs=str(tmp_path / "x.npz")), sweep=False)
    explained = data.payload["explain"]
    assert not explained["random_inputs"]["diverges"] and explained["random_weights"]["diverges"]
    assert explained["conclusion"].startswith("data")


def test_cli_audit_writes_every_file_and_json(tmp_path, model_file, cli):
    path = model_file("matmul_overflow_softmax")
    out = tmp_path / "audit"
    proc = cli("audit", path, "--target", "emulate:fp16", "-o", str(out), "--json", "--no-explain")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["schema"] == "reprokit.audit/1"
    assert sorted(os.listdir(out)) == [".reprokit", "audit.html", "audit.json", "audit.md", "layerwise.png",
                                       "overlay-isolated.json", "overlay-layerwise.json", "overlay-ranges.json"]
    assert os.listdir(out / ".reprokit") == ["owned.json"]  # the names reprokit claimed (reprokit/files.py)
    assert json.loads((out / "audit.json").read_text()) == payload
    assert payload["ranges"]["first"]["node"] == "matmul"
    assert payload["layerwise"]["first"]["node"] == "matmul"
    # the MatMul's overflowing logits stay fp32 only if the Softmax reading them does too
    assert payload["workaround"]["setting"] == "emulate:fp16,fp32-nodes=matmul;softmax"
    html = (out / "audit.html").read_text()
    assert "data:image/png;base64," in html and "<script" not in html
    md = (out / "audit.md").read_text()
    assert "## Knob sweep" in md and "emulate:fp16,fp32-nodes=matmul;softmax" in md
    human = cli("audit", path, "--target", "trt:fp16", "-o", str(tmp_path / "again"), "--ranges-only")
    assert human.returncode == 0, human.stderr
    assert "first matmul (MatMul)" in human.stdout and "target 0" in human.stdout


def test_cli_audit_bad_input(tmp_path, cli):
    assert_user_error(cli("audit", str(tmp_path / "missing.onnx"), "--target", "emulate:fp16",
                          "-o", str(tmp_path / "o")), 3, contains="model file not found")
    (tmp_path / "model.onnx").write_bytes(models.planted_overflow().SerializeToString())
    assert_user_error(cli("audit", str(tmp_path / "model.onnx"), "--target", "emulate:fp99",
                          "-o", str(tmp_path / "o")), 2, contains="unknown option")
    (tmp_path / "file").write_text("x")
    assert_user_error(cli("audit", str(tmp_path / "model.onnx"), "--target", "emulate:fp16",
                          "-o", str(tmp_path / "file")), 2, contains="not a directory")


def test_shrink_audit_puts_audit_and_sweep_into_the_report(tmp_path, model_file, cli):
    path = model_file("planted_overflow")
    out = tmp_path / "out"
    proc = cli("shrink", path, "--target", "emulate:fp16", "-o", str(out), "--audit")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((out / "audit" / "audit.json").read_text())
    assert payload["model"] == path  # the ORIGINAL model is audited
    assert payload["minimal"]["node_names"] == ["boom"] and payload["minimal"]["among_suspects"] == ["boom"]
    with tarfile.open(out / "report.tar.gz") as archive:
        names = archive.getnames()
        issue = archive.extractfile(next(n for n in names if n.endswith("/ISSUE.md"))).read().decode()
    assert any(n.endswith("/audit/audit.html") for n in names)
    # boom's output (~1e5) must be brought back into range by a kept reader: boom and back
    assert "What we tried" in issue and "`emulate:fp16,fp32-nodes=boom;back` → agree" in issue
    # the precision search found it (boom, ranked first, with its reader), run as printed
    assert "Smallest change that avoids it: keep 2 nodes in fp32 (searched over" in issue


def test_sweep_plan_for_tensorrt_orders_settings_by_size():
    """Pure planning (no engine): the TensorRT settings a user tries, smallest change first."""
    from reprokit.audit.sweep import plan

    settings = plan("trt:fp16,opt-level=3", [["a"], ["a", "b"]], (True, "1 LayerNorm"),
                    ("static-batch", "static input shapes"))
    assert [(s.key, s.target) for s in settings] == [
        ("fp32-nodes", "trt:fp16,opt-level=3,fp32-nodes=a"),
        ("fp32-nodes", "trt:fp16,opt-level=3,fp32-nodes=a;b"),
        ("layernorm", "trt:fp16,opt-level=3"),
        ("batch", "trt:fp16,opt-level=3"),
        ("narrow", "trt:opt-level=3,bf16"),
        ("no-tf32", "trt:fp16,opt-level=3,no-tf32"),
        ("fp32", "trt:opt-level=3"),
        ("fp32-full", "trt:opt-level=3,no-tf32"),
    ]
    assert [s.rank for s in settings] == sorted(s.rank for s in settings)
    ov = {s.key: s for s in plan("openvino:bf16", [["a"]], (False, "none"), None)}
    assert ov["fp32-nodes"].target == "openvino:bf16,fp32-nodes=a" and ov["narrow"].target == "openvino:f16"
    f32 = {s.key: s for s in plan("openvino:f32", [["a"]], (False, "none"), None)}
    assert f32["fp32-nodes"].target is None and "f32 already" in f32["fp32-nodes"].reason
    assert ov["fp32"].target == "openvino:f32" and ov["batch"].target is None


def test_the_workaround_search_starts_where_the_error_is_born_not_where_it_is_seen(tmp_path):
    """Magika's shape: x + 2048.3 is stored in fp16 (rounded), then Sub(2048) cancels and exposes
    the rounding, then Sqrt. The first diverging node is the Sub, but its input already carries
    the error: keeping the Sub in fp32 changes nothing; keeping the Add (that feeds it) does."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "shift"], ["a"], name="add"),
         helper.make_node("Sub", ["a", "unshift"], ["d"], name="cancel"),
         helper.make_node("Sqrt", ["d"], ["y"], name="sqrt")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(np.array(2048.3, np.float32), "shift"),
         numpy_helper.from_array(np.array(2048.0, np.float32), "unshift")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / "cancel.onnx")
    onnx.save(model, path)
    result = audit(path, "emulate:fp16", str(tmp_path / "out"), explain_inputs=False)
    assert result.verdict.kind.value == "mismatch"
    assert result.payload["suspects"]["layerwise_first"][0] == "cancel"
    assert "add" in result.payload["suspects"]["first_with_inputs"]
    found = result.workaround
    assert found and found["verdict"] == "agree" and "add" in found["setting"], found


def test_audit_of_a_check_command_says_no_setting_was_tried(tmp_path):
    """Found auditing nudenet 320n under a cmd: check that fails on any Softmax: every row of the
    sweep was "not applicable" (0 calls) and the audit concluded "none of the settings tried
    avoids it" — of no setting at all."""
    import sys

    # x[1,4] -> Softmax "sm" -> y[1,4]; the check fails on any Softmax
    path = models.save(models.make([helper.make_node("Softmax", ["x"], ["y"], name="sm")],
                                   [models.vi("x", [1, 4])], [models.vi("y", [1, 4])]), tmp_path / "m.onnx")
    script = tmp_path / "chk.py"
    script.write_text("import sys, onnx\n"
                      "sys.exit(1 if any(n.op_type == 'Softmax' for n in onnx.load(sys.argv[1]).graph.node) else 0)\n")
    result = audit(path, f"cmd:{sys.executable} {script} {{model}}", str(tmp_path / "audit"), explain_inputs=False)
    payload = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert all(row["verdict"] == "not applicable" for row in payload["sweep"]), payload["sweep"]
    assert payload["no_workaround"].startswith("no setting was tried"), payload["no_workaround"]
    assert result.workaround is None
