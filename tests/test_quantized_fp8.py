"""FP8 Q/DQ models (float8e4m3fn QuantizeLinear/DequantizeLinear, opset 19): their grid, their
range, which TensorRT precision they admit, and what runs them here.

Real models: ``_fp8_matmul`` below (an FP8 Q/DQ model as onnxruntime's quantize_static writes
one with QuantType.QFLOAT8E4M3FN); real engines: onnxruntime (fake-quant), the fp16 emulator,
OpenVINO. Nothing on this machine computes in FP8: OpenVINO 2026.4 rounds through f8 Converts
in float (docs/quantized.md, "FP8").
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reprokit.graph import qtypes, quant
from reprokit.graph.index import GraphIndex

SCALE = 0.01  # the activation scale: feeds up to 3.0 reach 300 in FP8 units (spacing 32 there)
WIDTH = 256  # outputs: enough that an fp16 rounding flips some FP8 roundings


def _fp8(array: np.ndarray, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(
        np.asarray(array, np.float32).astype(ml_dtypes.float8_e4m3fn), name
    )


def _fp8_matmul(x_range: float = 448 * SCALE) -> onnx.ModelProto:
    """x[1,64] -> Q(fp8, x_range/448) -> DQ -> MatMul(DQ(W fp8)) -> Q(fp8) -> DQ -> y[1,WIDTH]"""
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (64, WIDTH)).astype(np.float32)
    x_scale = x_range / 448
    inits = [
        numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"),
        _fp8(np.zeros(()), "zero"),
        _fp8(w / 0.01, "w_q"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0.05, np.float32), "y_scale"),
    ]
    nodes = [
        helper.make_node(
            "QuantizeLinear", ["x", "x_scale", "zero"], ["x_q"], name="x_QuantizeLinear"
        ),
        helper.make_node(
            "DequantizeLinear", ["x_q", "x_scale", "zero"], ["x_dq"], name="x_DequantizeLinear"
        ),
        helper.make_node(
            "DequantizeLinear", ["w_q", "w_scale", "zero"], ["w"], name="w_DequantizeLinear"
        ),
        helper.make_node("MatMul", ["x_dq", "w"], ["mm"], name="matmul"),
        helper.make_node(
            "QuantizeLinear", ["mm", "y_scale", "zero"], ["mm_q"], name="mm_QuantizeLinear"
        ),
        helper.make_node(
            "DequantizeLinear", ["mm_q", "y_scale", "zero"], ["y"], name="mm_DequantizeLinear"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "fp8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    return model


def _feeds(top: float = 3.0) -> dict:
    return {"x": np.random.default_rng(0).uniform(-top, top, (1, 64)).astype(np.float32)}


def test_fp8_tensors_lie_on_a_relative_grid_and_clip_past_448_scales():
    model = _fp8_matmul(x_range=1.0)  # calibrated for |x| <= 1, fed up to 3
    index = GraphIndex.build(model)
    assert qtypes.qdq_types(model) == {"float8e4m3fn"}
    grids = quant.tensor_grids(model, index)
    assert grids["x_dq"] == (pytest.approx(1.0 / 448), "float8e4m3fn")
    # 3 mantissa bits: spacing 1 from 8 to 16 units, 32 from 256 to 448, 2^-9 below the normals
    assert qtypes.float8_spacing("float8e4m3fn", 10.0) == 1.0
    assert qtypes.float8_spacing("float8e4m3fn", 300.0) == 32.0
    assert qtypes.float8_spacing("float8e4m3fn", 1e-4) == 2.0**-9
    lo, hi = qtypes.q_range(model, index, model.graph.node[0])
    assert (float(lo), float(hi)) == (
        pytest.approx(-1.0),
        pytest.approx(1.0),
    )  # not int8's ±127 steps
    feeds = _feeds()
    found = quant.clipping(model, index, feeds)
    assert [c.node for c in found] == ["x_QuantizeLinear"]
    # half the top spacing (16 of 448 units) is rounding, beyond it clipping
    assert found[0].clipped == pytest.approx(float(np.mean(np.abs(feeds["x"]) > 1.0 + 16 / 448)))


def test_an_fp16_rounding_of_an_fp8_quantized_model_is_below_one_fp8_step(tmp_path):
    """The emulator stores the Q input in fp16 before it is quantized to FP8: a rounding flip
    moves the output by one FP8 spacing at its magnitude (up to 32 scales near 448 units), which
    the int8 reading of the step — the scale itself — called a 10+ step divergence."""
    from reprokit.api import RunOptions, check

    path = str(tmp_path / "fp8.onnx")
    onnx.save(_fp8_matmul(), path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **_feeds())
    result = check(path, "emulate:fp16", options=RunOptions(inputs=str(inputs)))
    error = result.verdict.outputs[0]
    assert error.max_abs > 0  # the emulator did move the output: this is no comparison of equals
    assert not result.verdict.diverges and error.error <= 1, error
    assert "FP8 tensors" in result.verdict.quantized


def test_openvino_rounds_fp8_in_float_and_says_no_fp8_kernel_ran(tmp_path):
    pytest.importorskip("openvino", reason="openvino is not installed")
    from reprokit.api import RunOptions, check

    path = str(tmp_path / "fp8.onnx")
    onnx.save(_fp8_matmul(), path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **_feeds())
    result = check(path, "openvino:f32", options=RunOptions(inputs=str(inputs)))
    assert result.quantized.kernels.startswith("no fp8 kernel ran: openvino:f32"), (
        result.quantized.kernels
    )


@pytest.mark.parametrize(
    ("make", "target", "words"),
    [
        ("fp8", "trt:int8", "`trt:int8` on a model whose Q/DQ nodes are all FP8"),
        ("int8", "trt:fp8", "`trt:fp8` on a model whose Q/DQ nodes are int8, no FP8"),
    ],
)
def test_a_trt_precision_other_than_the_models_qdq_type_is_refused_before_any_build(
    tmp_path, cli, make, target, words
):
    """Explicit quantization runs Q/DQ in the type they name: a verdict under the other
    precision would name one that never ran. Refused with or without TensorRT installed."""
    import models
    from conftest import assert_user_error

    model = _fp8_matmul() if make == "fp8" else models.qdq_conv_chain()
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    done = cli("check", path, "--target", target)
    assert_user_error(done, 2, contains=words, hint_contains="trt:")


def test_audit_of_an_fp8_model_names_the_clipping_node_and_prints_an_fp8_quantization(tmp_path):
    """Calibrated for |x| <= 1, fed up to 3: the input's Q pair clips (±448 scales), leaving it out
    brings fake-quant back to its twin, and the printed quantize_static call quantizes to FP8 again."""
    from reprokit.audit import audit
    from reprokit.engine.session import RunOptions

    path = str(tmp_path / "fp8.onnx")
    onnx.save(_fp8_matmul(x_range=1.0), path)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **_feeds())
    result = audit(
        path, "ort", None, options=RunOptions(inputs=str(inputs)), sweep=False, explain_inputs=False
    )
    calib = result.payload["calibration"]
    assert calib["clipping"][0]["node"] == "x_QuantizeLinear"
    assert calib["cause"] == ["x_QuantizeLinear"] and calib["fix_within_tolerance"]
    assert "activation_type=QuantType.QFLOAT8E4M3FN" in calib["printed_fix"]
    assert calib["printed_fix"].endswith("nodes_to_exclude=['matmul'])")
