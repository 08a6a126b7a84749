"""Quantized (Q/DQ) models: units that move whole, the fp32 twin, the quantization step, clipping.

Real models: ``models.qdq_conv_chain`` (a QDQ model as quantize_static writes one) and, where
the optional packages are installed, MobileNetV2 quantized by onnxruntime's quantize_static
(samples/make_quantized.py). Real engines: onnxruntime (fake-quant, optimizations off).
"""

from __future__ import annotations

import json
import math
import sys

import models
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reprokit.graph import quant
from reprokit.graph.extract import extract
from reprokit.graph.index import GraphIndex


def _run(model, feeds: dict, outputs: list[str] | None = None) -> dict:
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    if outputs:
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(
            onnx.helper.make_empty_tensor_value_info(t) for t in outputs if t not in have
        )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


class _Store(dict):
    """Reference activations of every tensor, from one onnxruntime run of the whole model."""

    def get(self, name):  # the ActivationStore interface extraction reads
        return self[name]

    def info(self, name):
        return self[name].shape, self[name].dtype


def _needs_exports() -> None:
    """The HuggingFace exports of samples/make_quantized.py need transformers and torch."""
    pytest.importorskip(
        "transformers", reason="transformers is not installed (samples/make_quantized.py needs it)"
    )
    pytest.importorskip("torch", reason="torch is not installed")


def _make_quantized():
    """samples/make_quantized.py, the quantizer of the bundled recipes (a script, not a package)."""
    import importlib
    import sys

    sys.path.insert(0, str(models.__file__).rsplit("/", 2)[0] + "/samples")
    return importlib.import_module("make_quantized")


def _capture(model, feeds):
    every = [o for node in model.graph.node for o in node.output if o]
    return _Store(_run(model, feeds, every))


STEP = 16.0 / 127  # qdq_conv_chain's inner scale
FEEDS = {"x": np.random.default_rng(0).uniform(0, 1, (1, 4, 6, 6)).astype(np.float32)}


def test_units_pair_each_quantize_with_its_dequantize_and_regions_hold_a_quantized_op():
    model = models.qdq_conv_chain()
    index = GraphIndex.build(model)
    names = [n.name for n in model.graph.node]
    unit = index.units[names.index("x_QuantizeLinear")]
    assert {names[i] for i in unit} == {"x_QuantizeLinear", "x_DequantizeLinear"}
    assert names.index("w0_DequantizeLinear") not in index.units  # a weight DQ has no Q in front
    conv = {names[i] for i in index.region(names.index("conv0"))}
    assert conv == {
        "x_QuantizeLinear",
        "x_DequantizeLinear",
        "w0_DequantizeLinear",
        "conv0",
        "conv0_QuantizeLinear",
        "conv0_DequantizeLinear",
    }
    assert index.splits_unit({names.index("x_QuantizeLinear")}) == unit
    assert index.splits_unit(unit) is None
    plain = GraphIndex.build(models.small_mlp())
    assert plain.units == {} and plain.region(1) == frozenset([1])


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_candidate_that_keeps_units_whole_feeds_no_integer_cut_and_computes_the_model(data):
    """Property: a node set the one rule (GraphIndex.splits_unit) lets through never cuts between a
    QuantizeLinear and its DequantizeLinear (no int8 tensor enters or leaves it), keeps every
    scale, and computes the same tensors as the whole model on the same activations."""
    model = models.qdq_conv_chain(blocks=2)
    index = GraphIndex.build(model)
    store = _capture(model, FEEDS)
    n = len(model.graph.node)
    keep = frozenset(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    q_outputs = {node.output[0] for node in model.graph.node if node.op_type == "QuantizeLinear"}
    sub = extract(model, index, keep, store, feeds=FEEDS)
    # a small integer cut is baked in as an initializer (extract.py): a DQ of a frozen int8 value
    baked = {t.name for t in sub.model.graph.initializer}
    crossing = (set(sub.feeds) | set(sub.outputs) | baked) & q_outputs
    if index.splits_unit(keep) is not None:
        assert crossing, "a split unit must show as an integer tensor crossing the cut"
        return
    assert not crossing
    for node in sub.model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert node.input[1] in {t.name for t in sub.model.graph.initializer}
    got = _run(sub.model, sub.feeds)
    for name in sub.outputs:
        np.testing.assert_array_equal(got[name], store[name])


def test_the_fp32_twin_drops_activation_qdq_and_dequantizes_the_weights():
    model = models.qdq_conv_chain(x_range=0.5)
    twin = quant.fp32_twin(model)
    ops = [n.op_type for n in twin.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert ops.count("Conv") == 2
    quantized, fp32 = _run(model, FEEDS)["y"], _run(twin, FEEDS)["y"]
    # the input clips at 0.5 in the quantized model, not in its twin: they differ by far more than a step
    assert np.abs(quantized - fp32).max() > 10 * STEP
    wide = models.qdq_conv_chain(x_range=1.0)  # the whole feed range covered: only rounding is left
    assert np.abs(_run(wide, FEEDS)["y"] - _run(quant.fp32_twin(wide), FEEDS)["y"]).max() < 4 * STEP


def test_steps_and_clipping_name_the_quantize_node_that_clips():
    model = models.qdq_conv_chain(x_range=0.5)
    index = GraphIndex.build(model)
    steps = quant.tensor_steps(model, index)
    assert steps["x_dq"] == pytest.approx(0.5 / 127) and steps["y"] == pytest.approx(STEP)
    found = quant.clipping(model, index, _capture(model, FEEDS) | FEEDS)
    assert found[0].node == "x_QuantizeLinear"
    share = float(np.mean(FEEDS["x"] > 0.5 + 0.25 / 127))
    assert found[0].clipped == pytest.approx(share)
    assert found[0].reader_ops == ("conv0",)
    assert found[0].widen_by == pytest.approx(FEEDS["x"].max() / (127 * 0.5 / 127), rel=1e-3)


def test_check_says_the_divergence_is_the_quantizations_when_calibration_under_covers(tmp_path):
    """Under-covering calibration (the input scale holds |x| <= 0.5, the feeds reach 1): OpenVINO
    runs the Q/DQ model in int8 and agrees with fake-quant within a step; the fp32 twin differs by
    far more: the verdict names the quantization, not the engine, and says the model is quantized."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    from reprokit.api import RunOptions, check

    path = models.save(models.qdq_conv_chain(x_range=0.5), tmp_path / "qdq.onnx")
    result = check(path, "openvino:f32", options=RunOptions())
    assert not result.verdict.diverges
    assert "quantized ops" in result.verdict.quantized
    assert result.quantized.cause == "quantization"
    assert result.quantized.quantization["y"] > 0.1
    # OpenVINO's runtime model says so; onnxruntime's own optimized graph too
    assert "ops ran in int8 on openvino:f32" in result.quantized.kernels
    fused = check(path, "ort:opt", options=RunOptions())
    assert "ops ran in int8 on ort:opt" in fused.quantized.kernels
    # the same engine judged against the fp32 twin: the quantization's error now counts
    against = check(path, "openvino:f32", options=RunOptions(quant_reference="fp32"))
    assert against.verdict.diverges


def _mobilenet_dynamic(tmp_path):
    """HuggingFace MobileNetV2 (random weights) dynamically quantized by onnxruntime."""
    _needs_exports()

    from onnxruntime.quantization import QuantType, quantize_dynamic

    make_quantized = _make_quantized()

    fp32 = str(tmp_path / "mobilenetv2.fp32.onnx")
    make_quantized.make_mobilenetv2(fp32)
    dynamic = str(tmp_path / "mobilenetv2.dyn.onnx")
    quantize_dynamic(fp32, dynamic, weight_type=QuantType.QUInt8)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, **make_quantized.draw({"pixel_values": (1, 3, 64, 64)}, 1.5, 0))
    return dynamic, inputs


def test_a_dynamically_quantized_model_is_not_judged_at_the_fp32_tolerance(tmp_path):
    """Issue 38 finding 5: OpenVINO runs the integer ops of a dynamically quantized MobileNetV2
    and differs from onnxruntime by int8 rounding (rel-l2 ~2e-2); judged at fp32's 1e-4 that was
    a "bug". Now the tensors after quantized ops are judged at the int8 tolerance, and the
    verdict says the model holds quantized ops; a --tol of the user's own still holds."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    from reprokit.api import RunOptions, check

    model, inputs = _mobilenet_dynamic(tmp_path)
    result = check(model, "openvino:f32", options=RunOptions(inputs=inputs))
    error = result.verdict.outputs[0]
    assert 1e-4 < error.rel_l2 < 0.1  # int8 rounding, measured, not a guess
    assert not result.verdict.diverges
    assert "DynamicQuantizeLinear" in result.verdict.quantized
    strict = check(model, "openvino:f32", options=RunOptions(inputs=inputs, tolerance=1e-4))
    assert strict.verdict.diverges and not strict.verdict.quantized


def test_fp16_emulation_keeps_quantization_scales_in_fp32(tmp_path):
    """TensorRT keeps Q/DQ scales in fp32 at any precision; the emulator rounded them to fp16 and
    a subnormal scale (1e-4/127) moved by 1.5%: a Q/DQ pair alone diverged by 2 steps."""
    from reprokit.api import RunOptions, check

    path = models.save(models.qdq_small_scale(), tmp_path / "scale.onnx")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.random.default_rng(0).uniform(0, 1e-4, (1, 64)).astype(np.float32))
    result = check(path, "emulate:fp16", options=RunOptions(inputs=str(inputs)))
    assert not result.verdict.diverges, result.verdict.outputs
    assert result.verdict.outputs[0].error <= 1  # in steps: the DequantizeLinear's fp16 output only


def _quantize(fp32: str, out: str, exclude=()) -> str:
    """onnxruntime's quantize_static as samples/make_quantized.py calls it: QDQ, int8, per-channel,
    4 calibration samples at sigma 0.5."""

    make_quantized = _make_quantized()

    recipe = make_quantized.Recipe("test", None, "int8", per_channel=True)
    make_quantized.quantize(fp32, out, recipe, nodes_to_exclude=list(exclude))
    return out


def test_audit_names_the_clipping_quantize_node_that_causes_it_and_the_printed_fix_works(tmp_path):
    """Calibrated at sigma 0.5, fed at sigma 1.5: audit ranks the clipping QuantizeLinear nodes,
    finds by the causal test (the pair left out, reference runs) the one that causes the
    divergence from the fp32 twin, and prints quantize_static's nodes_to_exclude; quantizing
    again exactly as printed brings the model within the int8 tolerance of the fp32 model."""
    from reprokit.audit import audit
    from reprokit.engine.session import RunOptions

    fp32 = models.save(models.conv_relu_conv(), tmp_path / "fp32.onnx")
    qdq = _quantize(fp32, str(tmp_path / "qdq.onnx"))
    inputs = tmp_path / "inputs.npz"
    x = (np.random.default_rng(0).standard_normal((1, 4, 8, 8)) * 1.5).astype(np.float32)
    np.savez(inputs, x=x)
    result = audit(
        qdq, "ort", None, options=RunOptions(inputs=str(inputs)), sweep=False, explain_inputs=False
    )
    calib = result.payload["calibration"]
    assert calib["error"] > calib["tolerance"]
    assert calib["clipping"][0]["clipped"] > 0.1  # measured: most clipped first
    assert calib["cause"] and calib["error_fixed"] <= calib["tolerance"]
    assert calib["fix_within_tolerance"]
    assert calib["printed_fix"].endswith(f"nodes_to_exclude={calib['nodes_to_exclude']!r})")
    # tested as printed: quantize_static again with those nodes excluded
    fixed = _quantize(fp32, str(tmp_path / "fixed.onnx"), calib["nodes_to_exclude"])
    truth = _run(onnx.load(fp32), {"x": x})["y"]

    def rel(path):
        got = _run(onnx.load(path), {"x": x})["y"]
        return np.linalg.norm(got - truth) / np.linalg.norm(truth)

    assert rel(qdq) > calib["tolerance"] >= rel(fixed)


def test_shrink_keeps_qdq_units_whole_and_the_minimal_reproduces_under_verify(tmp_path, cli):
    """OpenVINO 2026.4 cannot compile an Add whose bias is a quantized all-zero constant (quantize_static
    with every op quantized, a fresh Linear bias): shrink reduces the 17-node model to the Add with
    its Q/DQ units — never a QuantizeLinear without its DequantizeLinear — and the archive
    reproduces under `reprokit verify` (exit 1)."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    path = models.save(models.qdq_zero_bias_add(), tmp_path / "zero_bias.onnx")
    out = tmp_path / "out"
    shrunk = cli("shrink", path, "--target", "openvino:f32", "-o", str(out), timeout=600)
    assert shrunk.returncode == 0, shrunk.stderr[-2000:]
    minimal = onnx.load(str(out / "minimal.onnx"))
    # the Add with the Q/DQ units that feed it: the named step asks the nodes OpenVINO names
    # (the Add, the DequantizeLinear nodes it reads) with their units whole (judging nodes alone,
    # an older code ended at 8 nodes, MatMul included; the survey's regions at 7, the Add's
    # output unit included)
    assert {n.name for n in minimal.graph.node} == {
        "bias_QuantizeLinear",
        "bias_DequantizeLinear",
        "mm_QuantizeLinear",
        "mm_DequantizeLinear",
        "add",
    }
    index = GraphIndex.build(minimal)
    for node in minimal.graph.node:
        if node.op_type == "QuantizeLinear":  # every Q keeps its DQ, every activation DQ its Q
            assert any(
                minimal.graph.node[r].op_type == "DequantizeLinear"
                for r in index.consumers[node.output[0]]
            )
    inputs = {i.name for i in minimal.graph.input}
    assert not inputs & {
        n.output[0] for n in onnx.load(path).graph.node if n.op_type == "QuantizeLinear"
    }
    verified = cli("verify", str(out / "report.tar.gz"), timeout=300)
    assert verified.returncode == 1, verified.stdout[-2000:]
    assert "REPRODUCES" in verified.stdout


def test_an_int8_activation_at_a_cut_is_fed_as_data_never_frozen_into_the_model(tmp_path):
    """QOperator format (QLinearConv chains): the int8 tensor between two QLinearConv nodes is an
    activation; cut there, it must stay a graph input fed with the captured value (small integer
    cuts — shapes, indices — are frozen in as constants; an engine would fold a frozen activation)."""

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    make_quantized = _make_quantized()

    fp32 = models.save(models.conv_relu_conv(), tmp_path / "fp32.onnx")
    qop = str(tmp_path / "qop.onnx")
    samples = iter([make_quantized.draw({"x": (1, 4, 8, 8)}, 0.5, 100 + k) for k in range(4)])

    class Reader:
        def get_next(self):
            return next(samples, None)

    quantize_static(
        fp32,
        qop,
        Reader(),
        quant_format=QuantFormat.QOperator,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    model = onnx.load(qop)
    index = GraphIndex.build(model)
    convs = [i for i, n in enumerate(model.graph.node) if n.op_type == "QLinearConv"]
    assert len(convs) == 2
    feeds = {"x": make_quantized.draw({"x": (1, 4, 8, 8)}, 1.5, 0)["x"]}
    store = _capture(model, feeds)
    sub = extract(model, index, {convs[1]}, store, feeds=feeds)
    cut = model.graph.node[convs[1]].input[0]
    assert cut in sub.feeds and sub.feeds[cut].dtype == np.uint8
    assert cut not in {t.name for t in sub.model.graph.initializer}
    np.testing.assert_array_equal(_run(sub.model, sub.feeds)[sub.outputs[0]], store[sub.outputs[0]])


@pytest.mark.parametrize("command", ["shrink", "audit"])
def test_quant_reference_fp32_outside_check_is_a_usage_error_before_any_work(
    tmp_path, cli, command
):
    """Only check compares with the fp32 twin: shrink and audit refuse the option (exit 2) instead of
    silently judging against fake-quant, and write nothing."""
    path = models.save(models.qdq_conv_chain(), tmp_path / "qdq.onnx")
    out = tmp_path / "out"
    done = cli(command, path, "--target", "ort", "-o", str(out), "--quant-reference", "fp32")
    assert done.returncode == 2
    assert (
        done.stderr.startswith("Error: --quant-reference fp32 is for check")
        and "Hint:" in done.stderr
    )
    assert not out.exists()


def test_the_fp32_twin_of_a_quantized_mobilenetv2_puts_back_the_relu6_the_quantizer_removed(
    tmp_path,
):
    """quantize_static removes MobileNetV2's Clip(0, 6) (ReLU6) and lets the Q/DQ pair's saturation
    stand for it; a twin that only drops the pair loses ReLU6 (it was 3.7e6 off the float model).
    The twin puts the Clip back with the bounds the quantizer left behind: it is then the float
    model up to the weights' rounding."""
    _needs_exports()

    make_quantized = _make_quantized()

    fp32 = str(tmp_path / "mobilenetv2.fp32.onnx")
    make_quantized.make_mobilenetv2(fp32)
    qdq = str(tmp_path / "mobilenetv2.qdq.onnx")
    make_quantized.quantize(fp32, qdq, make_quantized.RECIPES["mobilenetv2"])
    model = onnx.load(qdq)
    assert sum(quant.fused_activation(model, n) == "Clip" for n in model.graph.node) > 10
    feeds = make_quantized.draw({"pixel_values": (1, 3, 64, 64)}, 1.5, 0)
    truth = _run(onnx.load(fp32), feeds)["logits"]
    twin = _run(quant.fp32_twin(model), feeds)["logits"]
    assert np.linalg.norm(twin - truth) / np.linalg.norm(truth) < 0.1


def test_a_target_that_fails_on_a_quantized_model_is_the_engines_with_no_number(tmp_path):
    """OpenVINO 2026.4 does not compile quantize_static's all-zero quantized bias (a build error):
    `check` said "both: the engine differs from fake-quant by more than a step" — a number that
    never existed. Now the cause is the engine's, and the words say it did not run."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    from reprokit.api import RunOptions, check

    path = models.save(models.qdq_zero_bias_add(), tmp_path / "zero_bias.onnx")
    result = check(path, "openvino:f32", options=RunOptions())
    assert result.verdict.kind.value == "build-error"
    assert result.quantized.cause == "engine-failed"
    assert "did not run the quantized model (build-error)" in result.quantized.sentence()
    assert "more than a step" not in result.quantized.sentence()


def test_tensorrt_limits_name_int32_biases_and_shifted_zero_points_and_the_printed_recipe_clears_them(tmp_path):
    """TensorRT's ONNX parser refuses an int32 DequantizeLinear input (quantize_static quantizes
    Conv biases to int32 by default) and non-zero zero points (asymmetric uint8): the TensorRT-RTX
    1.7 builder on the H100 refused both (docs/gpu/issue40-rtx-qdq.log). The words name both, and
    the recipe they print (symmetric int8, biases left float), applied by quantize_static, leaves
    neither."""

    from reprokit.engine.quantized import tensorrt_limits

    fp32 = models.save(models.conv_relu_conv(bias=True), tmp_path / "fp32.onnx")
    default = onnx.load(_quantize(fp32, str(tmp_path / "qdq.onnx")))
    words = tensorrt_limits(default)
    assert "DequantizeLinear with an int32 input" in words and "QuantizeBias': False" in words
    assert "non-zero zero point" in tensorrt_limits(models.qdq_zero_bias_add())
    make_quantized = _make_quantized()

    recipe = make_quantized.Recipe("test", None, "uint8", per_channel=True)
    make_quantized.quantize(fp32, str(tmp_path / "trtq.onnx"), recipe, tensorrt=True)
    assert tensorrt_limits(onnx.load(str(tmp_path / "trtq.onnx"))) == ""


@pytest.mark.slow
def test_an_accumulated_quantized_run_packs_its_drift_window_judged_in_the_shrinks_steps(tmp_path, cli):
    """A HuggingFace ViT quantized by quantize_static under ort:opt (its int8 kernels): shrink finds
    an accumulated error and a 13-node drift window. Packed alone, the window's outputs have lost
    the Q nodes after them, so pack judged them at rel-l2 where the shrink judged them in steps:
    the window agreed and shrink ended exit 6 "nothing to pack" (seen on the H100 under ort:cuda
    too), then (f7b6e68) the whole 222-node model travelled instead. Now the shrink records the
    window's steps (summary.json window.quant_steps), pack judges with them, and the window's
    archive reproduces under verify."""
    _needs_exports()
    import json
    import tarfile

    make_quantized = _make_quantized()

    _, qdq, inputs = make_quantized.make("vit", str(tmp_path / "models"))
    out = tmp_path / "out"
    shrunk = cli("shrink", qdq, "--inputs", inputs, "--target", "ort:opt", "-o", str(out), timeout=900)
    assert shrunk.returncode == 0, shrunk.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "accumulated" and summary["report_reproduces"]
    window = summary["window"]
    assert not any("does not diverge when packed alone" in w for w in summary.get("warnings", []))
    assert window["quant_steps"]["steps"] and set(window["quant_steps"]["steps"]) <= set(window["outputs"])
    with tarfile.open(out / "report.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/model.onnx"))
        packed = onnx.load_from_string(tar.extractfile(member).read())
        issue = next(tar.extractfile(m) for m in tar.getmembers() if m.name.endswith("/ISSUE.md")).read().decode()
    assert len(packed.graph.node) == window["nodes"] < 222  # the window travels, not the whole model
    assert summary["report_holds"] == "the drift window"  # and summary/console say which travelled
    assert "in quantization steps where the model quantizes the output" in issue  # not "against 0.0001"
    verified = cli("verify", str(out / "report.tar.gz"), timeout=300)
    assert verified.returncode == 1 and "REPRODUCES" in verified.stdout


OV_COMPILES = """import sys
import openvino as ov
try:
    ov.Core().compile_model(ov.Core().read_model(sys.argv[1]), "CPU")
except Exception as exc:  # silent: no node names for the named step, the conflict search decides
    sys.exit(1 if "out of range" in str(exc) else 0)
"""


@pytest.mark.parametrize("check", ["openvino:f32", "cmd"])
def test_a_build_error_on_a_residual_qdq_stack_is_searched_unit_by_unit(tmp_path, cli, check):
    """A residual QDQ stack (each stage's input Q read by a DequantizeLinear at both ends of the
    stage) with a quantized all-zero bias Add OpenVINO 2026.4 cannot compile (issue 39, as on the
    quantized rapidocr classifier). Every question keeps the Q/DQ units whole: the named step
    (OpenVINO names the Add and the DequantizeLinear nodes feeding it) asks the Add with its
    units; a `cmd:` check that prints no names leaves it to the conflict search, which bisects
    units and counts the bias's unit as computing. The old code read each window cut through a
    spanning unit as a pass: 45 target calls (conflict 31) on openvino:f32, 126 conflict calls
    on the classifier. Bound: the module's pair bound, 2⌈log2 n⌉ + 3, for the whole search."""
    pytest.importorskip("openvino", reason="openvino is not installed")
    model = models.qdq_chain_zero_bias_add()
    path = models.save(model, tmp_path / "stack.onnx")
    target = check
    if check == "cmd":
        script = tmp_path / "compiles.py"
        script.write_text(OV_COMPILES)
        target = f"cmd:{sys.executable} {script} {{model}}"
    out = tmp_path / "out"
    shrunk = cli("shrink", path, "--target", target, "-o", str(out), timeout=600)
    assert shrunk.returncode == 0, shrunk.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["minimal"]["node_names"]) == sorted([
        "mm10_QuantizeLinear", "mm10_DequantizeLinear", "bias_QuantizeLinear", "bias_DequantizeLinear", "add"])
    assert summary["one_minimal"] is True
    search = sum(s["calls"] for s in summary["steps"] if s["step"] in ("named", "conflict"))
    assert search <= 2 * math.ceil(math.log2(len(model.graph.node))) + 3, summary["steps"]
