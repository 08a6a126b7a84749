"""The estimate of record prices a TensorRT build by its heavy layers (issue 39), counted on the
ONNX side by ``buildcost.heavy_layers``: convolutions, matrix multiplies, softmax and
normalization count; BatchNormalization (a SCALE layer, fused into its Conv), reduce, elementwise
layers, Constant nodes and shape arithmetic do not, nor a heavy node whose inputs are all known
at build time (folded into a weight). The count is checked against what TensorRT-RTX's own parser
made of the bundled samples and PP-OCRv4 (bench/results/buildcost/rtx_h100.jsonl's layer kinds).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import const, make, vi
from onnx import helper

from reprokit.shrink.buildcost import ESTIMATE, TENSORRT, heavy_layers

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "bench" / "results" / "buildcost" / "rtx_h100.jsonl"
TENSORRT_HEAVY = ("CONVOLUTION", "DECONVOLUTION", "MATRIX_MULTIPLY", "SOFTMAX", "NORMALIZATION")


def _mixed() -> onnx.ModelProto:
    # x[1,2,4,4] -> Conv(W) -> BatchNormalization -> Relu -> Reshape(to [1,32], the shape from
    #   Shape(x) -> Gather(0) -> Unsqueeze -> Concat(·, [32])) -> MatMul(M) -> Softmax
    #   -> LayerNormalization -> Add(F) -> ReduceMean -> y[1,1]
    #   F = MatMul(A, B) of two initializers: folded into a weight, built as none
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["sx"], name="shape"),
        helper.make_node("Gather", ["sx", "zero"], ["n0"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["n0", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "width"], ["to"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r", "to"], ["flat"], name="reshape"),
        helper.make_node("MatMul", ["flat", "M"], ["mm"], name="matmul"),
        helper.make_node("Softmax", ["mm"], ["sm"], axis=-1, name="softmax"),
        helper.make_node(
            "LayerNormalization", ["sm", "g", "beta"], ["ln"], axis=-1, name="layernorm"
        ),
        helper.make_node("MatMul", ["A", "B"], ["F"], name="folded_matmul"),
        helper.make_node("Add", ["ln", "F"], ["sum"], name="add"),
        helper.make_node("ReduceMean", ["sum"], ["y"], axes=[1], keepdims=1, name="reduce"),
    ]
    ints = onnx.TensorProto.INT64
    inits = [
        const("W", rng.normal(size=(2, 2, 3, 3))),
        const("s", np.ones(2)),
        const("b", np.zeros(2)),
        const("m", np.zeros(2)),
        const("v", np.ones(2)),
        const("M", rng.normal(size=(32, 8))),
        const("g", np.ones(8)),
        const("beta", np.zeros(8)),
        const("A", rng.normal(size=(1, 3))),
        const("B", rng.normal(size=(3, 8))),
        helper.make_tensor("zero", ints, [], [0]),
        helper.make_tensor("axes", ints, [1], [0]),
        helper.make_tensor("width", ints, [1], [32]),
    ]
    return make(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", [1, 1])], inits)


def test_heavy_layers_are_the_ones_a_builder_times():
    model = _mixed()
    # a real model: onnxruntime runs it
    out = ort.InferenceSession(model.SerializeToString()).run(
        None, {"x": np.ones((1, 2, 4, 4), np.float32)}
    )
    assert out[0].shape == (1, 1)
    # Conv, the MatMul fed by x, Softmax, LayerNormalization; not BN, Relu, the shape
    # arithmetic, the MatMul of two initializers, Add, ReduceMean
    assert heavy_layers(model) == 4
    # 14 nodes by the per-node estimate, 4 heavy layers by the estimate of record
    assert ESTIMATE.seconds(1, 4) == pytest.approx(ESTIMATE.per_call_s + 4 * ESTIMATE.per_heavy_s)


def test_a_chain_of_cheap_nodes_costs_a_call_and_a_body_is_counted():
    # x[1,8] -> 160 × (Relu -> Neg) -> y : 160 nodes, no heavy layer (the H200's chain160 built
    # in 0.06-0.09 s whole, where the per-node estimate says 0.5 s)
    chain, last = [], "x"
    for i in range(80):
        chain += [
            helper.make_node("Relu", [last], [f"r{i}"]),
            helper.make_node("Neg", [f"r{i}"], [f"n{i}"]),
        ]
        last = f"n{i}"
    chain.append(helper.make_node("Identity", [last], ["y"]))
    cheap = make(chain, [vi("x", [1, 8])], [vi("y", [1, 8])])
    assert heavy_layers(cheap) == 0
    assert ESTIMATE.seconds(1, heavy_layers(cheap)) < TENSORRT.seconds(1, len(cheap.graph.node)) / 5
    # cond -> If(then: x -> MatMul(W) -> Softmax; else: x -> Identity) -> y : the then-branch's
    # two heavy layers are built (TensorRT builds both branches)
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Softmax", ["t"], ["o1"])],
        "then",
        [],
        [vi("o1", [1, 8])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["o2"])], "else", [], [vi("o2", [1, 8])]
    )
    branchy = make(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
        [vi("cond", [], onnx.TensorProto.BOOL), vi("x", [1, 8])],
        [vi("y", [1, 8])],
        [const("W", np.eye(8))],
    )
    assert heavy_layers(branchy) == 2


def _whole_models() -> list[tuple[str, Path, int]]:
    """(file, path here, TensorRT-RTX's heavy layers) for the raw lines' whole models found here:
    the bundled samples, PP-OCRv4 det/rec from rapidocr when installed."""
    try:
        import rapidocr_onnxruntime

        ocr = Path(rapidocr_onnxruntime.__file__).parent / "models"
    except ImportError:  # the PP-OCRv4 rows are skipped then; the samples still run
        ocr = None
    found = []
    for line in RAW.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") != "whole":
            continue
        name = row["file"]
        path = ROOT / "samples" / name
        if name.startswith("ppocrv4_") and ocr is not None:
            path = ocr / f"ch_PP-OCRv4_{name.split('_')[1][:-5]}_infer.onnx"
        if path.exists():
            found.append(
                (name, path, sum(n for k, n in row["layer_kinds"].items() if k in TENSORRT_HEAVY))
            )
    return found


@pytest.mark.parametrize(
    "name, path, measured", _whole_models(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_the_onnx_count_is_tensorrts(name, path, measured):
    """TensorRT-RTX 1.7's parser on the H100 (bench/trt_buildcost.py's layer kinds): the ONNX-side
    count equals its heavy layers on every whole model recorded that is found here."""
    assert heavy_layers(onnx.load(path, load_external_data=False)) == measured, name


def test_every_recorded_sample_is_checked():
    names = {name for name, _, _ in _whole_models()}
    assert {"attention_softmax_nan.onnx", "layernorm_overflow.onnx", "conv_clip.onnx"} <= names


def _relu_chain(length: int) -> onnx.ModelProto:
    # x[1,8] -> Relu -> Relu -> ... (length nodes) -> y : light layers only
    nodes = [
        helper.make_node("Relu", [f"t{i}" if i else "x"], [f"t{i + 1}"]) for i in range(length)
    ]
    nodes[-1].output[0] = "y"
    return make(nodes, [vi("x", [1, 8])], [vi("y", [1, 8])])


def _conv_net() -> onnx.ModelProto:
    # x[1,2,4,4] -> Conv(W) -> Relu -> y : one heavy layer
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    return make(
        nodes,
        [vi("x", [1, 2, 4, 4])],
        [vi("y", [1, 2, 2, 2])],
        [const("W", np.ones((2, 2, 3, 3), np.float32))],
    )


def test_a_call_of_light_layers_only_is_priced_below_one_holding_a_conv():
    # The raw builds (trt_buildcost_fit.py --compare's light-call table): a one-node light build
    # takes 11-15 ms on the H100, 17-20 ms on the H200, a Conv alone 45-75 ms; the 160-node chain
    # 0.06-0.09 s whole. A light call is priced by its nodes, a call with heavy layers by them.
    light, conv = _relu_chain(1), _conv_net()
    assert heavy_layers(light) == 0 and heavy_layers(conv) == 1
    one_light = ESTIMATE.call_seconds(len(light.graph.node), heavy_layers(light))
    assert 0.011 <= one_light < 0.030
    assert ESTIMATE.call_seconds(len(conv.graph.node), heavy_layers(conv)) > 2 * one_light
    chain = _relu_chain(160)
    assert 0.055 <= ESTIMATE.call_seconds(len(chain.graph.node), heavy_layers(chain)) <= 0.09
    # a run's totals: the same sum, call by call or from the totals with the light calls named
    calls = [(light, 0), (conv, 1), (chain, 0)]
    each = sum(ESTIMATE.call_seconds(len(m.graph.node), h) for m, h in calls)
    assert ESTIMATE.seconds(3, 1, light_calls=2, light_nodes=161) == pytest.approx(each)
    # light calls not named: every call priced as one holding heavy layers (as before)
    assert ESTIMATE.seconds(3, 1) == pytest.approx(3 * ESTIMATE.per_call_s + ESTIMATE.per_heavy_s)
