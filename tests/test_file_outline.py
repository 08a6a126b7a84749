"""graph/io.file_outline: a model file's external data files and node list, kept from its first
parse, so that a run's later readers (the files a command reads, --resume's weights digest, the
drift window's anchor) do not parse the user's file again (a Swin: 110 MB, five parses a run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reprokit.cli.options import files_read
from reprokit.graph import io
from reprokit.shrink.runstate import weights_digest

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "attention_softmax_nan.onnx"


def counting_parses(monkeypatch) -> list[str]:
    """Every path onnx.load parses from here on (the real onnx.load does the parsing)."""
    seen: list[str] = []
    real = onnx.load

    def load(path, *args, **kwargs):
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", load)
    return seen


def test_the_users_file_is_parsed_once_for_its_later_readers(tmp_path, monkeypatch):
    model = str(shutil.copy(SAMPLE, tmp_path / "model.onnx"))
    given = onnx.load(str(SAMPLE))
    parses = counting_parses(monkeypatch)
    assert files_read(model, {}) == [model]
    assert weights_digest(model) == ""  # no external data
    assert parses == [model]
    outline = io.file_outline(model)
    assert parses == [model]
    loaded = io.load_model(model, load_weights=False)  # the command's own load takes that parse
    assert parses == [model]
    assert loaded == given
    io.load_model(model, load_weights=False)  # taken once: a second load parses (a private copy)
    assert parses == [model, model]
    assert [(n.name, n.op_type) for n in outline.nodes] == [
        (n.name, n.op_type) for n in given.graph.node
    ]
    assert outline.locations == frozenset()


def test_a_rewritten_file_is_parsed_again(tmp_path):
    # x → Relu → y, then the same file rewritten as x → Relu → Neg → y (with external data)
    path = str(tmp_path / "m.onnx")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    first = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x], [y])
    )
    onnx.save(first, path)
    assert [n.op_type for n in io.file_outline(path).nodes] == ["Relu"]
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="r"),
        helper.make_node("Add", ["h", "w"], ["y"]),
    ]
    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    second = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [weight]))
    onnx.save(second, path, save_as_external_data=True, location="m.data", size_threshold=0)
    outline = io.file_outline(path)
    assert [(n.name, n.op_type) for n in outline.nodes] == [("r", "Relu"), ("", "Add")]
    assert outline.locations == frozenset({"m.data"})
