"""The fold's check of a large model (issue 39, the bookkeeping slice): the unfolded model's
reference run does not depend on the fold, so for a file of OVERLAP_BYTES or more that will fold
it runs in its worker while onnxruntime folds in reprokit's process (a Swin: ~1.5 s of folding in
the shadow of a ~1.5 s engine run), and the folded model is the same as before.

test_the_unfolded_reference_runs_beside_the_fold fails on the tree before this change (b2e27f8):
every reference run of the check ran in the main thread, after the fold; the others guard the
new path (they pass there too, where they can import)."""

from __future__ import annotations

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine import folding
from reprokit.engine.folding import checked_fold, reference_runner


def heavy_foldable(side: int = 1100):
    """x[1,side] → MatMul(w: side×side, ~4.6 MiB) → Add(c) → MatMul(w2) → y, where c = Mul(Constant
    k, s) is computed from constants alone (what folding removes); the file is over 8 MiB."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((side, side)).astype(np.float32) / side, "w"),
             numpy_helper.from_array(rng.standard_normal((side, side)).astype(np.float32) / side, "w2"),
             numpy_helper.from_array(np.full((1, side), 0.5, np.float32), "s")]
    nodes = [helper.make_node("Constant", [], ["k"], name="k_const",
                              value=numpy_helper.from_array(np.full((1, side), 3.0, np.float32))),
             helper.make_node("Mul", ["k", "s"], ["c"], name="bias_from_constants"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "c"], ["hc"], name="add_bias"),
             helper.make_node("MatMul", ["hc", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, side])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_the_unfolded_reference_runs_beside_the_fold(tmp_path):
    model = heavy_foldable()
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    assert (tmp_path / "m.onnx").stat().st_size >= 8 << 20
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 1100)).astype(np.float32)}
    runner = reference_runner("ort", str(tmp_path / "check"))
    threads: list[str] = []

    def run(model_path, arrays):  # the real reference runner; records which thread asked
        threads.append(threading.current_thread().name)
        return runner(model_path, arrays)

    result = checked_fold(onnx.load(path), feeds, run, str(tmp_path / "fold"), model_path=path)
    assert result.folded, result.note
    assert [n.op_type for n in result.model.graph.node] == ["MatMul", "Add", "MatMul"]
    assert len(threads) == 2 and threads[0].startswith("reprokit-fold-check"), threads
    assert threads[1] == threading.current_thread().name  # the folded model's run needs the fold
    assert runner.seconds > 0


def test_will_fold_reads_constant_computations_only():
    from reprokit.engine.folding import will_fold

    assert will_fold(heavy_foldable(8))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    plain = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [w])
    assert not will_fold(helper.make_model(plain))  # reads the input: nothing to fold
    fed = helper.make_graph([helper.make_node("Neg", ["w"], ["n"]), helper.make_node("Add", ["x", "n"], ["y"])],
                            "g", [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 4])], [y], [w])
    assert not will_fold(helper.make_model(fed))  # an initializer that is also an input can be fed
    rand = helper.make_graph([helper.make_node("RandomNormal", [], ["r"], shape=[1, 4]),
                              helper.make_node("Add", ["x", "r"], ["y"])], "g", [x], [y])
    assert not will_fold(helper.make_model(rand))


def test_a_small_model_folds_as_before(tmp_path):
    """Under OVERLAP_BYTES: both reference runs in the caller's thread, one after the other."""
    model = heavy_foldable(16)
    path = str(tmp_path / "small.onnx")
    onnx.save(model, path)
    assert (tmp_path / "small.onnx").stat().st_size < folding.OVERLAP_BYTES
    runner = reference_runner("ort", str(tmp_path / "check"))
    threads: list[str] = []

    def run(model_path, arrays):
        threads.append(threading.current_thread().name)
        return runner(model_path, arrays)

    feeds = {"x": np.ones((1, 16), np.float32)}
    result = checked_fold(onnx.load(path), feeds, run, str(tmp_path / "fold"), model_path=path)
    assert result.folded and threads == [threading.current_thread().name] * 2, threads
