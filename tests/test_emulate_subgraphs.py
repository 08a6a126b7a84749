"""Issue 18, finding 1: the storage emulator rounds inside If/Loop bodies, not only their outputs.

Each model's expected numbers come from a numpy simulation that rounds every stored value
through the narrow type, step by step, as the emulator promises.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from models import FLOAT, const, make, save, vi
from onnx import TensorProto, helper

from reprokit.api import RunOptions, check


def narrow(value, kind: str) -> np.ndarray:
    dtype = np.float16 if kind == "fp16" else ml_dtypes.bfloat16
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=np.float32).astype(dtype).astype(np.float32)


def branch_model(then_nodes, then_out: str, n: int = 8, weights=()):
    """The work sits in the then-branch of an If whose condition holds for these inputs."""
    # x[1,n] -> ReduceMax -> Greater(-1) -> c;  If(c){ then_nodes(x) -> then_out } else { Identity(x) } -> y
    then = helper.make_graph(then_nodes, "then", [], [vi(then_out, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["x_else"])], "else", [], [vi("x_else", None)])
    return make(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0, name="max"),
            helper.make_node("Greater", ["m", "minus_one"], ["c"], name="greater"),
            helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
        ],
        [vi("x", [1, n])],
        [vi("y", [1, n])],
        [const("minus_one", -1.0), *weights],
    )


def run(tmp_path, model, target: str, feeds: dict):
    path = save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "feeds.npz", **feeds)
    return check(path, target, options=RunOptions(inputs=str(tmp_path / "feeds.npz")))


def test_fp16_overflow_inside_an_if_branch_diverges(tmp_path):
    """Exp overflows fp16 inside the branch; the branch normalizes it before leaving the If,
    so the If's own (rounded) output looks harmless. Before the fix: AGREES."""
    # then: x -> Exp -> e -> ReduceSum -> s;  (e, s) -> Div -> p   (e = exp(12) > 65504 in fp16)
    model = branch_model(
        [helper.make_node("Exp", ["x"], ["e"], name="exp"),
         helper.make_node("ReduceSum", ["e"], ["s"], keepdims=1, name="sum"),
         helper.make_node("Div", ["e", "s"], ["p"], name="div")],
        "p",
    )
    x = np.linspace(11.0, 12.0, 8, dtype=np.float32).reshape(1, 8)
    result = run(tmp_path, model, "emulate:fp16", {"x": x})
    assert result.verdict.diverges
    assert result.verdict.kind.value == "nonfinite"
    # bf16 holds exp(12) (its range is fp32's): the same model agrees there.
    assert not run(tmp_path, model, "emulate:bf16", {"x": x}).verdict.diverges


def test_fp16_and_bf16_round_differently_inside_an_if(tmp_path):
    """(x + 1000) - 1000 inside the branch: fp16 keeps x to 0.5, bf16 to 8 (cancellation)."""
    # then: x -> Add(1000) -> a -> Sub(1000) -> d
    model = branch_model(
        [helper.make_node("Add", ["x", "thousand"], ["a"], name="add"),
         helper.make_node("Sub", ["a", "thousand"], ["d"], name="sub")],
        "d",
        weights=[const("thousand", 1000.0)],
    )
    x = np.linspace(0.0, 6.0, 8, dtype=np.float32).reshape(1, 8)
    outputs = {}
    for kind in ("fp16", "bf16"):
        result = run(tmp_path, model, f"emulate:{kind}", {"x": x})
        outputs[kind] = np.array(result.target_outputs["y"])
        a = narrow(narrow(x, kind) + narrow(1000.0, kind), kind)
        expected = narrow(a - narrow(1000.0, kind), kind)
        np.testing.assert_array_equal(outputs[kind], expected)
    assert not np.array_equal(outputs["fp16"], outputs["bf16"])


def test_fp16_and_bf16_round_every_loop_iteration(tmp_path):
    """v += step, 200 times, step an outer-scope weight read from the body: each stored sum is
    rounded, so fp16 (ulp 2^-10 at 1) and bf16 (ulp 2^-7) stall at different values."""
    # x[4] -> Loop(200){ v_in -> Add(step, outer) -> v_out } -> y[4]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Add", ["v_in", "step"], ["v_out"], name="add_step")],
        "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("v_in", [4])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [4])],
    )
    model = make(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body, name="loop")],
        [vi("x", [4])],
        [vi("y", [4])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [200]),
         helper.make_tensor("go", TensorProto.BOOL, [], [True]),
         const("step", 0.003)],
    )
    assert model.graph.output[0].type.tensor_type.elem_type == FLOAT
    x = np.array([1.0, 1.5, 2.0, 3.0], dtype=np.float32)
    outputs = {}
    for kind in ("fp16", "bf16"):
        result = run(tmp_path, model, f"emulate:{kind}", {"x": x})
        outputs[kind] = np.array(result.target_outputs["y"])
        v, step = narrow(x, kind), narrow(0.003, kind)
        for _ in range(200):
            v = narrow(v + step, kind)
        np.testing.assert_array_equal(outputs[kind], v)
    assert not np.array_equal(outputs["fp16"], outputs["bf16"])
    # Rounding once at the Loop's output would have given about x + 0.6.
    assert not np.allclose(outputs["bf16"], x + 0.6, atol=0.05)


def test_scan_bodies_are_rounded_too(tmp_path):
    """A running sum in a Scan body: each stored partial sum is rounded (bf16: 8 bits)."""
    # (s0[4], xs[64,4]) -> Scan{ s_in + x_t -> s_out (state), s_out -> y_t (scanned) } -> (s[4], ys[64,4])
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"], name="accumulate"),
         helper.make_node("Identity", ["s_out"], ["y_t"], name="emit")],
        "body",
        [vi("s_in", [4]), vi("x_t", [4])],
        [vi("s_out", [4]), vi("y_t", [4])],
    )
    model = make(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, name="scan")],
        [vi("s0", [4]), vi("xs", [64, 4])],
        [vi("s", [4]), vi("ys", [64, 4])],
    )
    s0 = np.array([1.0, 10.0, 100.0, 1000.0], dtype=np.float32)
    xs = np.full((64, 4), 0.37, dtype=np.float32)
    result = run(tmp_path, model, "emulate:bf16", {"s0": s0, "xs": xs})
    s = narrow(s0, "bf16")
    for row in narrow(xs, "bf16"):
        s = narrow(s + row, "bf16")
    np.testing.assert_array_equal(np.array(result.target_outputs["s"]), s)
