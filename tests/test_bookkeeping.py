"""Bookkeeping off the path (issue 39 item 4): an engine call's outputs come back as ONE file
read memory-mapped (not one .npy per tensor), the captured activations stay one file per capture
run, shrink folds constants before the survey while every name it prints is the user's, and the
drift window is anchored in the user's file, so --input-shapes does not move it."""

from __future__ import annotations

import json
import os
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine.worker import run_in_worker
from reprokit.graph.model import node_labels
from reprokit.graph.pack import build_pack, feed_key
from reprokit.standalone.arrays import save_npz


def _save(model, path) -> str:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return str(path)


def branches_model():
    """x[4,16] → 6 × (Mul by w_k → Tanh), every Tanh an output: a call with many outputs."""
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for k in range(6):
        inits.append(
            numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), f"w{k}")
        )
        nodes += [
            helper.make_node("Mul", ["x", f"w{k}"], [f"m{k}"], name=f"scale{k}"),
            helper.make_node("Tanh", [f"m{k}"], [f"t{k}"], name=f"squash{k}"),
        ]
        outs.append(helper.make_tensor_value_info(f"t{k}", TensorProto.FLOAT, [4, 16]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])], outs, inits
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_a_calls_outputs_come_back_in_one_file_as_views_of_one_map(tmp_path):
    """The emulator's run of a 6-output model: the worker's folder holds one outputs file and no
    .npy per tensor; each output is a read-only view of that one map (feed_key names the file)
    and holds what onnxruntime computes, within fp16 storage error."""
    path = _save(branches_model(), tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    feeds = save_npz(str(tmp_path / "feeds.npz"), {"x": x})
    result = run_in_worker("emulate:fp16", path, feeds, str(tmp_path / "job"))
    assert result.status == "ok", result.message
    files = sorted(os.listdir(tmp_path / "job"))
    assert "outputs.bin" in files and not [f for f in files if f.endswith(".npy")], files
    expected = dict(
        zip(
            [f"t{k}" for k in range(6)],
            ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x}),
        )
    )
    assert sorted(result.outputs) == sorted(expected)
    for name, want in expected.items():
        got = result.outputs[name]
        assert got.shape == want.shape and not got.flags.writeable
        assert feed_key(got)[:2] == ("file", str(tmp_path / "job" / "outputs.bin"))
        np.testing.assert_allclose(got, want, atol=2e-3)
    result.discard()


def overflow_after_constants():
    """x[4,16] → Mul(x, Mul(Constant 300, 2)) → MatMul(w=100, unnamed: MatMul_3) → Relu (unnamed):
    the two constant nodes fold away; the MatMul overflows fp16 (inf)."""
    w = numpy_helper.from_array(np.full((16, 16), 100.0, np.float32), "w")
    two = numpy_helper.from_array(np.array([2.0], np.float32), "two")
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="scale_const",
            value=numpy_helper.from_array(np.array([300.0], np.float32)),
        ),
        helper.make_node("Mul", ["c", "two"], ["scale"], name="scale_double"),
        helper.make_node("Mul", ["x", "scale"], ["xs"], name="input_scale"),
        helper.make_node("MatMul", ["xs", "w"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [w, two],
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_shrink_folds_constants_before_the_survey_and_keeps_the_users_names(tmp_path):
    """By default the constant nodes fold (5 → 3 nodes) and the summary says so with the flag
    that turns it off; the minimal model, the summary and the archive name the user's node (the
    unnamed MatMul by its label in the user's file, MatMul_3, not its position after folding).
    --no-fold-constants reduces all 5."""
    model = overflow_after_constants()
    path = _save(model, tmp_path / "m.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["original"]["nodes"] == 3 and summary["original"]["file_nodes"] == 5
    assert (
        "constants folded" in summary["original"]["why"]
        and "--no-fold-constants" in summary["original"]["why"]
    )
    assert summary["minimal"]["node_names"] == ["MatMul_3"] and "MatMul_3" in node_labels(model)
    assert [n.name for n in onnx.load(str(out / "minimal.onnx")).graph.node] == ["MatMul_3"]
    with tarfile.open(out / "report.tar.gz") as archive:
        packed = next(m for m in archive.getmembers() if m.name.endswith("/model.onnx"))
        assert [
            n.name for n in onnx.load_from_string(archive.extractfile(packed).read()).graph.node
        ] == ["MatMul_3"]

    plain = tmp_path / "plain"
    proc = run_cli(
        "shrink",
        path,
        "--target",
        "emulate:fp16",
        "-o",
        str(plain),
        "--no-fold-constants",
        "--no-pack",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((plain / "summary.json").read_text())
    assert summary["original"]["nodes"] == 5 and "file_nodes" not in summary["original"]
    assert summary["minimal"]["node_names"] == ["MatMul_3"]


def drifting_mlp_after_constants(layers: int = 24):
    """x[8,64] → Mul(x, Add(Constant 0.5, 0.5)) → layers × (MatMul → Tanh): a constant prefix that
    folds, then bf16 errors that add up (an accumulated error)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([0.5], np.float32), "half")]
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="one_const",
            value=numpy_helper.from_array(np.array([0.5], np.float32)),
        ),
        helper.make_node("Add", ["c", "half"], ["one"], name="one_sum"),
        helper.make_node("Mul", ["x", "one"], ["h"], name="input_unit"),
    ]
    h = "h"
    for k in range(layers):
        inits.append(
            numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), f"w{k}")
        )
        nodes += [
            helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
            helper.make_node("Tanh", [f"m{k}"], [f"t{k}"], name=f"tanh{k}"),
        ]
        h = f"t{k}"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [8, 64])],
        inits,
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_the_drift_window_is_anchored_in_the_users_file_whatever_input_shapes_says(tmp_path):
    """The same accumulated error shrunk with and without --input-shapes: the window's anchor
    (its first and last node's positions in the user's file) is the same, and names the
    positions of the nodes the window starts and ends with in that file."""
    model = drifting_mlp_after_constants()
    path = _save(model, tmp_path / "mlp.onnx")
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    inputs = save_npz(str(tmp_path / "x.npz"), {"x": x})
    windows = []
    for number, extra in enumerate([(), ("--input-shapes", "x:8x64")]):
        out = tmp_path / f"out{number}"
        proc = run_cli(
            "shrink",
            path,
            "--target",
            "emulate:bf16",
            "--tol",
            "0.01",
            "--inputs",
            inputs,
            "-o",
            str(out),
            "--no-pack",
            *extra,
        )
        assert proc.returncode == 0, proc.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "accumulated"
        windows.append(summary["window"])
    first, second = windows
    where = {n.name: i for i, n in enumerate(model.graph.node)}
    assert first["anchor"] == second["anchor"]
    anchor = first["anchor"]
    assert anchor["of"] == len(model.graph.node) == 51
    assert (anchor["first"], anchor["last"]) == (where[first["first"]], where[first["last"]])
    assert anchor["last"] - anchor["first"] + 1 == first["nodes"] < 48


def test_packs_of_captured_activations_share_one_feed_per_tensor(tmp_path):
    """A guard, not a regression test: two extractions fed views of the same tensor of one
    outputs file still share one pack input (feed_key reads the file and offset under the view,
    not the view object), as they did when each tensor was its own .npy."""
    path = _save(branches_model(), tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    feeds = save_npz(str(tmp_path / "feeds.npz"), {"x": x})
    result = run_in_worker("ort", path, feeds, str(tmp_path / "job"))
    from reprokit.graph.extract import Extraction

    def member(tensor: str, k: int):
        node = helper.make_node("Neg", [tensor], [f"n{k}"], name=f"neg{k}")
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(tensor, TensorProto.FLOAT, [4, 16])],
            [helper.make_tensor_value_info(f"n{k}", TensorProto.FLOAT, [4, 16])],
        )
        model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
        return Extraction(model, {tensor: result.outputs[tensor]}, [f"n{k}"])

    pack = build_pack(
        [member("t0", 0), member("t0", 1), member("t1", 2)], keep_node_names=False, share_feeds=True
    )
    assert len(pack.feeds) == 2  # t0 once, t1 once
    result.discard()


def test_a_tensor_file_gives_back_every_dtype_and_shape_it_was_given(tmp_path):
    """0-d, empty, bfloat16 (raw bits plus its note), strings, transposed (not contiguous) and
    int64 tensors come back equal, in their dtype and shape, read-only; a file of nothing maps."""
    import ml_dtypes

    from reprokit.engine.tensorfile import Tensors, write_tensors

    given = {
        "scalar": np.float16(3),
        "empty": np.zeros((0, 3), np.int64),
        "bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "words": np.array(["a", "bc"], dtype=object),
        "transposed": np.arange(12.0).reshape(3, 4).T,
        "ids": np.arange(5, dtype=np.int64),
    }
    path = str(tmp_path / "t.bin")
    back = Tensors(path, write_tensors(path, given.items()))
    for name, want in given.items():
        got = back[name]
        assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, name
        assert np.array_equal(got, want), name
    assert not back["ids"].flags.writeable
    nothing = str(tmp_path / "none.bin")
    assert len(Tensors(nothing, write_tensors(nothing, []))) == 0


def test_the_fold_check_runs_the_users_file_and_the_checked_file_is_the_one_used(tmp_path):
    """x[4,16] + (w · s), w·s constant: folding turns Mul into a weight. The check's reference
    runs read the user's file as it is (no copy of it is saved: a Swin's 110 MB were written
    once more) and the folded file it ran becomes prepared.onnx (not serialized a second
    time); it computes what the user's model computes."""
    from reprokit.engine.session import RunOptions, prepare

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32), "w")
    s = numpy_helper.from_array(np.float32(0.5) * np.ones((4, 16), np.float32), "s")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["w", "s"], ["ws"], name="scale"),
         helper.make_node("Add", ["x", "ws"], ["y"], name="shift")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w, s])
    path = _save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]),
                 tmp_path / "m.onnx")
    state = tmp_path / "state"
    prepared = prepare(path, RunOptions(), str(state), fold=True)
    assert prepared.path == str(state / "prepared.onnx")
    assert [n.op_type for n in onnx.load(prepared.path).graph.node] == ["Add"]
    assert [n.op_type for n in prepared.model.graph.node] == ["Add"]
    assert not [f for f in os.listdir(state / "fold-check") if f.endswith(".onnx")], os.listdir(state / "fold-check")
    x = {"x": prepared.feeds.arrays["x"]}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, x)[0]
    got = ort.InferenceSession(prepared.path, providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_archives_check_counts_as_engine_time_not_reprokits(tmp_path):
    """pack judges the minimal model once more, on both engines in worker processes, before it
    writes the archive: summary.json counts those runs' seconds as engine time
    (``resources.pack_engine_seconds``, inside ``engine_seconds``), as it counts the fold's
    check, so ``bench_bookkeeping.py``'s "own" share is reprokit's own work."""
    path = _save(overflow_after_constants(), tmp_path / "m.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    resources = summary["resources"]
    assert summary["report_reproduces"] and resources["pack_engine_seconds"] > 0, resources
    assert resources["engine_seconds"] >= summary["calls"]["target_seconds"] + resources["pack_engine_seconds"] - 0.002



def heavy_chain():
    """x[1,1024] → MatMul(w0) → Relu → MatMul(w1) → Relu → MatMul(w2) → y: three 4 MiB weights
    (12 MiB, over shrink's LIGHT_WEIGHT_BYTES); w2's entries are large, so the last MatMul's
    sums overflow fp16 (its weights themselves fit)."""
    rng = np.random.default_rng(0)
    scales = (1 / 32, 1 / 32, 1e5 / 32)
    inits = [numpy_helper.from_array((rng.standard_normal((1024, 1024)) * s).astype(np.float32), f"w{k}")
             for k, s in enumerate(scales)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a0"], name="mm0"), helper.make_node("Relu", ["a0"], ["r0"], name="relu0"),
             helper.make_node("MatMul", ["r0", "w1"], ["a1"], name="mm1"), helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def test_candidates_reference_the_runs_one_weights_file_instead_of_copying_weights(tmp_path):
    """A model with 12 MiB of inline weights: shrink writes them once to its state folder and
    every model file it writes for a call (captures, the survey pack, candidates, shape crops)
    references that file — none holds a weight's bytes —, while minimal.onnx and the archive's
    model.onnx are whole files holding the user's weight (cropped by the shapes pass from the
    referenced bytes: a contiguous block of w2)."""
    model = heavy_chain()
    path = _save(model, tmp_path / "heavy.onnx")
    x = np.random.default_rng(1).standard_normal((1, 1024)).astype(np.float32)
    inputs = save_npz(str(tmp_path / "x.npz"), {"x": x})
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "--inputs", inputs, "-o", str(out), "--keep-state")
    assert proc.returncode == 0, proc.stderr
    weights = out / ".reprokit" / "models" / "weights" / "model.weights"
    assert weights.exists() and weights.stat().st_size >= 12 << 20
    # final.onnx is the result judged alone as the file that travels: whole, as minimal.onnx
    written = [os.path.join(base, f) for base, _, files in os.walk(out / ".reprokit") for f in files
               if f.endswith(".onnx") and f != "final.onnx"]
    assert written and all(os.path.getsize(f) < 64 << 10 for f in written), [
        (f, os.path.getsize(f)) for f in written if os.path.getsize(f) >= 64 << 10]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["minimal"]["node_names"] == ["mm2"], summary["minimal"]
    assert summary["report_reproduces"] is True
    with tarfile.open(out / "report.tar.gz") as archive:
        model_bytes = next(archive.extractfile(m).read() for m in archive.getmembers()
                           if m.name.endswith("/model.onnx"))
    w2 = numpy_helper.to_array(model.graph.initializer[2])
    for data in ((out / "minimal.onnx").read_bytes(), model_bytes):
        small = onnx.load_from_string(data)
        (weight,) = [numpy_helper.to_array(t) for t in small.graph.initializer if t.name == "w2"]
        (row, col), = np.argwhere(w2 == weight[0, 0])  # random floats: the first entry is met once
        np.testing.assert_array_equal(weight, w2[row:row + weight.shape[0], col:col + weight.shape[1]])
