"""The fold's check run doubles as the capture (issue 39, Swin start-up): a shrink that folds
constants runs the reference twice before its first target call — the model as given, then the
folded model with every node output marked, which is both the fold's check and the captured
activations — not three times (the capture was a third run of the folded model).

Reference runs are counted where every one of them starts, ``run_in_worker`` of the fold's
check and of the oracle, with the real function called through (a count, not a stand-in).
test_a_folded_shrink_runs_the_reference_twice_before_its_first_target_call fails on the tree
before this change (c931647: three runs); the others hold the guarantees the change must keep
(they pass there too).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine import folding, oracle, worker
from reprokit.engine.session import RunOptions, make_oracle, prepare
from reprokit.graph.index import GraphIndex
from reprokit.shrink.budget import Limits
from reprokit.shrink.start import capture
from reprokit.shrink.steps import shrink


def _overflow_after_folded_bias() -> onnx.ModelProto:
    """x[1,8] → Add(c) → MatMul(w) → Mul(big) → y, where c = Mul(Constant k, s) is computed from
    constants alone (what folding removes) and big·(x+c)·w passes fp16's 65504 (emulate:fp16: inf)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["k"],
            name="k_const",
            value=numpy_helper.from_array(np.full((1, 8), 3.0, np.float32)),
        ),
        helper.make_node("Mul", ["k", "s"], ["c"], name="bias_from_constants"),
        helper.make_node("Add", ["x", "c"], ["h"], name="add_bias"),
        helper.make_node("MatMul", ["h", "w"], ["m"], name="mm"),
        helper.make_node("Mul", ["m", "big"], ["y"], name="scale"),
    ]
    inits = [
        numpy_helper.from_array(np.full((1, 8), 0.5, np.float32), "s"),
        numpy_helper.from_array(rng.uniform(0.5, 1.0, (8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array(4.0e4, np.float32), "big"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def reference_runs(monkeypatch):
    """(spec, model file, marked outputs) of every worker run, in order, through the real worker."""
    runs: list[tuple[str, str, object]] = []

    def counted(spec, model_path, feeds_path, job_dir, **kwargs):
        runs.append((spec, model_path, kwargs.get("output_names")))
        return worker.run_in_worker(spec, model_path, feeds_path, job_dir, **kwargs)

    monkeypatch.setattr(folding, "run_in_worker", counted)
    monkeypatch.setattr(oracle, "run_in_worker", counted)
    return runs


def _shrink(tmp_path, **kwargs):
    path = str(tmp_path / "m.onnx")
    onnx.save(_overflow_after_folded_bias(), path)
    return shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(), **kwargs)


def test_a_folded_shrink_runs_the_reference_twice_before_its_first_target_call(
    tmp_path, reference_runs
):
    summary = _shrink(tmp_path).summary
    assert summary["status"] == "done" and summary["signature"]["kind"] == "nonfinite", summary[
        "signature"
    ]
    assert summary["minimal"]["node_names"] == ["scale"]
    assert summary["original"]["nodes"] == 3 and summary["original"]["file_nodes"] == 5  # folded
    first_target = next(k for k, run in enumerate(reference_runs) if run[0].startswith("emulate"))
    before = reference_runs[:first_target]
    assert [spec for spec, _, _ in before] == ["ort", "ort"], reference_runs
    assert before[0][2] is None  # the model as given, its own outputs
    assert set(before[1][2]) == {"h", "m", "y"}  # the folded model, every node output marked
    assert summary["calls"]["reference"] == 1  # the capture, counted as the reference call it is


def _prepared(tmp_path, name: str, within):
    path = str(tmp_path / "m.onnx")
    onnx.save(_overflow_after_folded_bias(), path)
    state = str(tmp_path / name)
    judge = make_oracle("emulate:fp16", RunOptions(), str(tmp_path / name / "calls"))
    prepared = prepare(path, RunOptions(), state, fold=True, capture_within=within)
    index = GraphIndex.build(prepared.model)
    names = [t for outs in index.node_outputs for t in outs]
    store = capture(
        judge,
        prepared.model,
        index,
        prepared.feeds.arrays,
        names,
        state,
        state,
        False,
        Limits(),
        lambda text: None,
        prepared.check_capture,
    )
    return prepared, store, judge


def test_the_taken_capture_holds_what_a_capture_run_of_its_own_holds(tmp_path, reference_runs):
    taken, store, judge = _prepared(tmp_path, "taken", 1 << 30)
    assert taken.check_capture is not None and judge.stats.reference == 1
    own, own_store, own_judge = _prepared(tmp_path, "own", None)
    assert own.check_capture is None and own_judge.stats.reference == 1
    assert len(reference_runs) == 2 + 3  # two for each fold's check, one capture of its own
    assert sorted(store._files) == sorted(own_store._files) == ["h", "m", "y"]  # the index's names
    for name in ("h", "m", "y"):
        np.testing.assert_array_equal(store.get(name), own_store.get(name))


def test_a_capture_that_needs_several_runs_does_not_take_the_check_run(tmp_path, reference_runs):
    result = _shrink(
        tmp_path, limits=Limits(capture_chunk_bytes=40)
    )  # 32 bytes a tensor: one per run
    assert result.summary["status"] == "done"
    first_target = next(k for k, run in enumerate(reference_runs) if run[0].startswith("emulate"))
    before = reference_runs[:first_target]
    assert before[1][2] is None, before  # the fold's check ran the folded model's outputs only
    assert len(before) == 2 + 3, before  # then the capture: h, m, y one run each
    assert not any(
        "fold-check" in str(p) for p in (tmp_path / "out").rglob("*.bin")
    )  # no kept run left


def test_a_fold_that_changes_the_outputs_is_refused_and_its_marked_run_discarded(tmp_path):
    """The unfolded model's outputs as the check knows them are not what the folded model
    computes (given here as 1.5 times them, as a wrong fold would make them differ): the fold is
    refused in the same words as without marking, and the marked run's tensors leave no file."""
    model = _overflow_after_folded_bias()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)}
    runner = folding.reference_runner("ort", str(tmp_path / "check"))
    right = runner(_saved(model, tmp_path), feeds)
    wrong = {"y": right["y"] * 1.5}
    notes = []
    for within in (1 << 30, None):  # marked (the capture's run), then as it was
        result = folding.checked_fold(
            model,
            feeds,
            runner,
            str(tmp_path / f"fold-{within}"),
            reference_outputs=wrong,
            capture_within=within,
        )
        assert not result.folded and result.capture is None
        notes.append(result.note)
    assert notes[0] == notes[1] and "computes something else (output 'y' differs" in notes[0], notes
    assert not list((tmp_path / "check").rglob("*.bin")), list((tmp_path / "check").rglob("*"))


def _saved(model, tmp_path) -> str:
    path = str(tmp_path / "given.onnx")
    onnx.save(model, path)
    return path
