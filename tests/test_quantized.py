"""Quantized (Q/DQ) models: units that move whole, the fp32 twin, the quantization step, clipping.

Real models: ``models.qdq_conv_chain`` (a QDQ model as quantize_static writes one) and, where
the optional packages are installed, MobileNetV2 quantized by onnxruntime's quantize_static
(samples/make_quantized.py). Real engines: onnxruntime (fake-quant, optimizations off).
"""

from __future__ import annotations

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
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in outputs if t not in have)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


class _Store(dict):
    """Reference activations of every tensor, from one onnxruntime run of the whole model."""

    def get(self, name):  # the ActivationStore interface extraction reads
        return self[name]

    def info(self, name):
        return self[name].shape, self[name].dtype


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
    assert conv == {"x_QuantizeLinear", "x_DequantizeLinear", "w0_DequantizeLinear", "conv0",
                    "conv0_QuantizeLinear", "conv0_DequantizeLinear"}
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
