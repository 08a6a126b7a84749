"""Issue 28, item 9: one containment check for external data over every tensor an ONNX model can
hold. A tensor whose external-data location leaves the model folder ('../secret.bin') is refused
(exit 3, "leaves the model folder") before any engine runs, wherever it sits: an initializer, a
sparse initializer, a Constant's sparse_value, an attribute's ``tensors`` list, a model-local
function body, an If branch. Before, only initializers, ``attr.t`` and subgraphs were checked, and
only onnxruntime's own refusal kept the others from being read."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import assert_user_error, run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.graph.tensors import all_tensors

OUTSIDE = "../secret.bin"


def external(name: str, location: str = OUTSIDE) -> TensorProto:
    """A float tensor [2] whose data lives (supposedly) in ``location``."""
    tensor = numpy_helper.from_array(np.zeros(2, np.float32), name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "8")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def sparse(name: str) -> onnx.SparseTensorProto:
    indices = numpy_helper.from_array(np.array([0], np.int64), f"{name}_indices")
    return helper.make_sparse_tensor(external(name), indices, [2])


def vi(name: str, shape=(2,)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def model_with(placement: str) -> onnx.ModelProto:
    """x[2] -> Add(x, w) -> y[2], where w (or a tensor beside it) sits in ``placement``."""
    nodes, initializers, sparse_initializers, functions = [], [], [], []
    add = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    if placement == "initializer":
        initializers.append(external("w"))
    elif placement == "sparse_initializer":
        sparse_initializers.append(sparse("w"))
    elif placement == "constant_sparse_value":
        nodes.append(helper.make_node("Constant", [], ["w"], name="c", sparse_value=sparse("w")))
    elif placement == "attribute_tensors":
        initializers.append(numpy_helper.from_array(np.zeros(2, np.float32), "w"))
        holder = helper.make_node("Identity", ["w"], ["w2"], name="holder")
        holder.attribute.append(helper.make_attribute("extra", [external("hidden")]))
        nodes.append(holder)
    elif placement == "function_body":
        body = helper.make_node("Constant", [], ["w"], value=external("w"))
        functions.append(helper.make_function("local", "MakeW", [], ["w"], [body],
                                              [helper.make_opsetid("", 17)]))
        nodes.append(helper.make_node("MakeW", [], ["w"], domain="local", name="make_w"))
    elif placement == "if_branch":
        then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=external("wt"))], "then", [],
                                 [vi("t")])
        other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=external("we", "w.bin"))], "else",
                                  [], [vi("e")])
        initializers.append(numpy_helper.from_array(np.array(True), "cond"))
        nodes.append(helper.make_node("If", ["cond"], ["w"], name="branch", then_branch=then, else_branch=other))
    graph = helper.make_graph(nodes + [add], "g", [vi("x")], [vi("y")], initializers,
                              sparse_initializer=sparse_initializers)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(graph, opset_imports=opsets, functions=functions)


PLACEMENTS = ["initializer", "sparse_initializer", "constant_sparse_value", "attribute_tensors", "function_body",
              "if_branch"]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_walker_sees_the_external_tensor(placement):
    locations = [t.external_data[0].value for t in all_tensors(model_with(placement)) if t.external_data]
    assert OUTSIDE in locations, placement


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_a_location_outside_the_model_folder_is_refused_wherever_it_sits(tmp_path, placement):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 8)  # it exists: only the check refuses it
    (folder / "w.bin").write_bytes(b"\x00" * 8)
    onnx.save(model_with(placement), folder / "m.onnx")
    proc = run_cli("check", str(folder / "m.onnx"), "-t", "emulate:fp16", cwd=tmp_path)
    assert_user_error(proc, 3, contains="leaves the model folder")
