"""subgraph.extract: any node subset of a model is a valid standalone model that, fed with the
captured activations, computes exactly the tensors the full model computes.

Activations are captured the way shrink does it: one onnxruntime run (graph optimizations off)
with every node output marked, stored as .npy files behind a real ActivationStore.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import shrink_models as sm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reprokit.engine.activations import ActivationStore
from reprokit.graph.extract import extract
from reprokit.graph.index import GraphIndex


class Captured:
    """A model with its feeds, every node output from onnxruntime, and those tensors on disk."""

    _ids = itertools.count()

    def __init__(self, model: onnx.ModelProto, root):
        self.model = model
        self.feeds = sm.uniform_feeds(model)
        names = sm.node_output_names(model)
        self.values = sm.ort_run(model, self.feeds, names)
        directory = root / f"capture{next(self._ids)}"
        directory.mkdir()
        files = {}
        for i, name in enumerate(names):
            np.save(directory / f"t{i:03d}.npy", self.values[name])
            files[name] = f"t{i:03d}.npy"
        self.store = ActivationStore(str(directory), files)
        self.index = GraphIndex.build(model)

    def extract(self, keep):
        return extract(self.model, self.index, keep, self.store, feeds=self.feeds)

    def truth(self, name: str) -> np.ndarray:
        return self.feeds[name] if name in self.feeds else self.values[name]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    root = tmp_path_factory.mktemp("captures")
    cache: dict = {}

    def get(key, make):
        if key not in cache:
            cache[key] = Captured(make(), root)
        return cache[key]

    return get


def assert_extraction_is_exact(cap: Captured, keep) -> onnx.ModelProto:
    sub = cap.extract(keep)
    model = sub.model
    onnx.checker.check_model(model, full_check=True)
    kept_nodes = [cap.model.graph.node[i].name for i in sorted(keep)]
    assert [n.name for n in model.graph.node] == kept_nodes
    assert model.ir_version == cap.model.ir_version
    assert list(model.opset_import) == list(cap.model.opset_import)

    produced = {t for i in keep for t in cap.index.node_outputs[i]}
    consumed = {t for i in keep for t in cap.index.node_inputs[i]}
    wanted_outputs = [
        t
        for i in sorted(keep)
        for t in cap.index.node_outputs[i]
        if t not in consumed or t in cap.index.graph_outputs
    ]
    assert [o.name for o in model.graph.output] == wanted_outputs == sub.outputs
    init = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in init]
    assert sorted(inputs) == sorted(sub.feeds)
    assert not set(inputs) & produced
    for name, value in sub.feeds.items():  # feeds are the captured activations themselves
        assert np.array_equal(value, cap.truth(name)), name
    for tensor in model.graph.initializer:  # cut tensors made constants hold captured values too
        if tensor.name not in cap.index.initializers:
            value = onnx.numpy_helper.to_array(tensor)
            assert np.array_equal(value, cap.truth(tensor.name)), tensor.name

    got = sm.ort_run(model, sub.feeds)
    for name, value in got.items():
        want = cap.truth(name)
        assert value.dtype == want.dtype and value.shape == want.shape, name
        assert np.array_equal(value, want), f"{name} differs from the full model's tensor"
    return model


@st.composite
def dag_and_subset(draw):
    seed = draw(st.integers(0, 40))
    n_nodes = draw(st.integers(10, 20))
    subset = draw(st.sets(st.integers(0, n_nodes - 1), min_size=1))
    return seed, n_nodes, sorted(subset)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=dag_and_subset())
def test_any_node_subset_extracts_to_a_valid_model_computing_the_same_tensors(captured, case):
    seed, n_nodes, subset = case
    cap = captured(("dag", seed, n_nodes), lambda: sm.random_dag(seed, n_nodes))
    assert len(cap.model.graph.node) == n_nodes
    assert_extraction_is_exact(cap, subset)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_contiguous_windows_of_real_fault_models_extract_exactly(captured, data):
    makers = {
        "branch_fault": sm.branch_fault,
        "two_outputs": sm.two_outputs_one_diverges,
        "fusion": sm.conv_relu_fusion,
        "clip": sm.clip_empty_min_fault,
        "if_loop": sm.if_loop_fault,
    }
    name = data.draw(st.sampled_from(sorted(makers)))
    cap = captured(name, makers[name])
    n = len(cap.model.graph.node)
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    assert_extraction_is_exact(cap, list(range(start, end)))


def test_integer_cut_tensors_become_constants(captured):
    cap = captured(("dag", 7, 20), lambda: sm.random_dag(7, 20))
    shapes = [i for i, n in enumerate(cap.model.graph.node) if n.op_type == "Shape"]
    reshapes = [i for i, n in enumerate(cap.model.graph.node) if n.op_type == "Reshape"]
    assert shapes and reshapes, "seed 7 should hold a Shape -> Reshape pair"
    model = assert_extraction_is_exact(cap, [reshapes[0]])
    shape_tensor = cap.model.graph.node[reshapes[0]].input[1]
    assert shape_tensor in {t.name for t in model.graph.initializer}
    assert shape_tensor not in {i.name for i in model.graph.input}


def test_empty_optional_input_is_kept_empty(captured):
    cap = captured("clip", sm.clip_empty_min_fault)
    clip = [i for i, n in enumerate(cap.model.graph.node) if n.op_type == "Clip"][0]
    model = assert_extraction_is_exact(cap, [clip])
    assert list(model.graph.node[0].input) == ["r", "", "cmax"]
    assert "" not in {i.name for i in model.graph.input}


def test_subgraph_nodes_get_their_outer_scope_reads_as_inputs(captured):
    cap = captured("if_loop", sm.if_loop_fault)
    names = [n.name for n in cap.model.graph.node]
    branch, loop = names.index("branch"), names.index("loop")
    assert "a" in cap.index.node_inputs[branch] and "k" in cap.index.node_inputs[branch]
    assert "a" in cap.index.node_inputs[loop] and "half" in cap.index.node_inputs[loop]
    model = assert_extraction_is_exact(cap, [branch, loop])
    inputs = {i.name for i in model.graph.input}
    assert "a" in inputs  # read only inside the If branches and the Loop body
    assert "cond" in inputs  # an If's condition computed at run time stays an input (folded, the If would resolve)
    assert {"k", "half", "trips", "true"} <= {t.name for t in model.graph.initializer}
    assert cap.index.ancestors(loop) == {
        names.index(n) for n in ("relu", "rsum", "gt", "branch", "loop")
    }


def test_ancestors_within_a_subset_stop_at_its_border(captured):
    cap = captured("branch_fault", sm.branch_fault)
    names = [n.name for n in cap.model.graph.node]
    out = names.index("b/out")
    assert {names[i] for i in cap.index.ancestors(out)} == {"b/scale", "b/mm", "b/softmax", "b/out"}
    within = {names.index("b/softmax"), out, names.index("b/scale")}
    assert {names[i] for i in cap.index.ancestors(out, within=within)} == {"b/softmax", "b/out"}
