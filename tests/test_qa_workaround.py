"""The workaround as a new user tries it from an archive: ``python repro.py --target
'emulate:fp16,fp32-nodes=NODE'`` must judge as ``reprokit check`` does. Found here (each test fails
on e970ed4): an unnamed node named the way reprokit names it (``Mul_1``, docs/cli.md) was ignored by
repro.py, which said REPRODUCES (exit 1) where reprokit says the workaround agrees (exit 0); a
misspelt node was ignored too (REPRODUCES, having kept nothing); and a strongly typed TensorRT or
``ort:cuda,fp16`` run built ``model.fp16.onnx``, converted with the packed target's fp32 nodes,
whatever fp32-nodes the command asked for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import numpy as np
import onnx
import pytest
from conftest import extract_data, run_cli
from onnx import TensorProto, helper, numpy_helper


def _unnamed_overflow() -> onnx.ModelProto:
    """x[1,8] -> Mul(k=300) -> Mul(k=300) -> y, both nodes unnamed (Mul_0, Mul_1 to reprokit):
    x up to 2 reaches 1.8e5, past fp16's 65504, only at Mul_1's output."""
    k = numpy_helper.from_array(np.array(300.0, np.float32), "k")
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]), helper.make_node("Mul", ["a", "k"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "unnamed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [k],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa-workaround")
    onnx.save(_unnamed_overflow(), root / "tiny.onnx")
    np.savez(root / "in.npz", x=np.linspace(0.5, 2, 8, dtype=np.float32)[None])
    done = run_cli(
        "pack", "tiny.onnx", "--inputs", "in.npz", "--target", "emulate:fp16", "-o", "t.tar.gz",
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(root / "t.tar.gz") as tar:
        extract_data(tar, root / "x")
    folder = next(p for p in (root / "x").iterdir() if p.is_dir())
    assert not any(n.name for n in onnx.load(str(folder / "model.onnx")).graph.node)
    return root, folder


def _repro(folder, target):
    return subprocess.run(
        [sys.executable, "repro.py", "--target", target],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "POLYGRAPHY_USE_TENSORRT_RTX"},
    )


@pytest.mark.parametrize(("node", "expected"), [("Mul_1", 0), ("Mul_0", 1)])
def test_repro_py_keeps_an_unnamed_node_as_reprokit_does(packed, node, expected):
    root, folder = packed
    target = f"emulate:fp16,fp32-nodes={node}"
    checked = run_cli("check", "tiny.onnx", "--inputs", "in.npz", "--target", target, cwd=root)
    assert checked.returncode == expected, checked.stdout + checked.stderr
    done = _repro(folder, target)
    assert done.returncode == expected, done.stdout + done.stderr
    assert ("REPRODUCES: nonfinite" in done.stdout) == (expected == 1)


def test_a_node_the_model_lacks_is_a_wrong_command_line(packed):
    _, folder = packed
    for target in ("emulate:fp16,fp32-nodes=Mul_7", "trt:fp16,fp32-nodes=Mul_1;nosuch"):
        done = _repro(folder, target)
        assert done.returncode == 64, done.stdout + done.stderr
        assert (
            "fp32-nodes names no node of model.onnx" in done.stdout
            and "REPRODUCES" not in done.stdout
        )


@pytest.mark.parametrize(
    "target", ["trt:strongly-typed,fp16,fp32-nodes=Mul_1", "ort:cuda,fp16,fp32-nodes=Mul_1"]
)
def test_the_packed_conversion_is_not_run_for_other_fp32_nodes(packed, target):
    """model.fp16.onnx keeps the packed target's nodes (none here): running it for fp32-nodes=Mul_1
    would report the workaround's verdict for a model that kept nothing. Exit 4, before any engine
    is imported (no TensorRT or GPU needed to see it)."""
    _, folder = packed
    done = _repro(folder, target)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "model.fp16.onnx was converted with fp32-nodes none, not Mul_1" in done.stdout


def test_the_printed_tensorrt_commands_pin_the_layer_tensorrt_names(packed):
    """TensorRT's ONNX parser names an unnamed node's layer ``node_of_<first output>``
    (onnx-tensorrt importerUtils.cpp getNodeName): `--layer-precisions Mul_0:float32` named
    no layer of the network, so nothing was pinned. The archive keeps the user's bytes; the
    printed polygraphy line pins by each layer's origin through repro.py's fp32_layers, which
    names the node as TensorRT does (tests/test_qa_trt_layers.py runs it on a parsed network)."""
    from test_trt_commands import polygraphy_lines, polygraphy_parses

    root, _ = packed
    done = run_cli(
        "pack", "tiny.onnx", "--inputs", "in.npz", "--target", "emulate:fp16,fp32-nodes=Mul_0",
        "-o", "kept.tar.gz", cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(root / "kept.tar.gz") as tar:
        extract_data(tar, root / "kept")
    folder = next(p for p in (root / "kept").iterdir() if p.is_dir())
    commands = (folder / "commands.sh").read_text()
    weak = [line for line in polygraphy_lines(commands) if "--strongly-typed" not in line]
    assert weak and all(
        "--trt-network-postprocess-script repro.py:fp32_layers" in line for line in weak
    )
    for line in weak:
        polygraphy_parses(line)
    assert "--layerPrecisions" not in commands and "Mul_0:" not in commands


def test_a_passing_check_with_no_outputs_is_not_called_agreeing_outputs(packed):
    """`python repro.py --target 'cmd:python -c pass'` compares nothing (the command writes no
    outputs): it said "every output agrees within rel-l2 <= 0.01"; exit 0 either way."""
    _, folder = packed
    done = _repro(folder, f"cmd:{sys.executable} -c pass")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gave no outputs to compare" in done.stdout and "every output agrees" not in done.stdout


def test_repro_py_pins_an_unnamed_node_by_tensorrt_s_layer_name(packed):
    """repro.py's weakly typed TensorRT run pins the layers whose origin is a kept node; for an
    unnamed node TensorRT's origin is ``node_of_<first output>``, never the OP_INDEX label. The
    archive's own repro.py is loaded as a module (its main is not run) on its own model.onnx."""
    import importlib.util

    _, folder = packed
    spec = importlib.util.spec_from_file_location("archive_repro", folder / "repro.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert module.trt_node_names(str(folder / "model.onnx"), ["Mul_1"]) == {"node_of_y"}
    assert module.trt_node_names(str(folder / "model.onnx"), ["Mul_0", "named"]) == {
        "node_of_a",
        "named",
    }
