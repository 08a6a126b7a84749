"""Engines' own log lines (onnxruntime's "[W:onnxruntime:…]", graphsurgeon's "[W]") never reach
the console of check/shrink/audit: they go to OUT/engine.log, and are shown with -v or --debug (issue 15, reprokit/enginelog.py)."""

from __future__ import annotations

import numpy as np
from conftest import run_cli
from models import const, make, save, vi
from onnx import helper

ENGINE_LINE = ("onnxruntime:", "[W]", "[E:")


def overflow_with_unused_weight():
    """x ─Mul(1e3)─Mul(1e3)─▶ y (fp16 overflows) plus an initializer no node reads, which
    onnxruntime warns about on every session ("Removing initializer 'unused_w'")."""
    return make([helper.make_node("Mul", ["x", "k"], ["a"], name="m1"),
                 helper.make_node("Mul", ["a", "k"], ["y"], name="m2")],
                [vi("x", [1, 4])], [vi("y", [1, 4])],
                [const("k", np.float32(1e3)), const("unused_w", np.zeros(3))])


def unsqueeze_output():
    """W ─Unsqueeze─▶ Wu (a graph output), x ─Add(Wu)─▶ y: ort's optimizer (ort:opt) warns
    "UnsqueezeElimination cannot remove node unsq"."""
    return make([helper.make_node("Unsqueeze", ["W", "axes"], ["Wu"], name="unsq"),
                 helper.make_node("Add", ["x", "Wu"], ["y"], name="add")],
                [vi("x", [1, 4])], [vi("y", [1, 4]), vi("Wu", [1, 4])],
                [const("W", np.arange(4)), helper.make_tensor("axes", 7, [1], [0])])


def assert_quiet(proc):
    for line in (proc.stdout + proc.stderr).splitlines():
        if not line.startswith(("Error: ", "Hint: ")):  # reprokit's own words may quote an engine
            assert not any(word in line for word in ENGINE_LINE), f"engine line on the console: {line}"


def test_check_keeps_engine_lines_in_the_log(tmp_path):
    save(unsqueeze_output(), tmp_path / "m.onnx")
    proc = run_cli("check", "m.onnx", "-t", "ort:opt", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_quiet(proc)
    log = (tmp_path / "out" / "engine.log").read_text()
    assert "UnsqueezeElimination cannot remove node unsq" in log
    assert "\x1b[" not in log  # onnxruntime's colours stripped
    shown = run_cli("-v", "check", "m.onnx", "-t", "ort:opt", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "UnsqueezeElimination cannot remove node unsq" in shown.stderr
    assert "UnsqueezeElimination" not in shown.stdout  # stdout stays the result


def test_shrink_keeps_engine_lines_in_the_log(tmp_path):
    save(overflow_with_unused_weight(), tmp_path / "m.onnx")
    proc = run_cli("shrink", "m.onnx", "-t", "emulate:fp16", "-o", "out", "--no-pack", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_quiet(proc)
    log = (tmp_path / "out" / "engine.log").read_text()
    assert "Removing initializer 'unused_w'" in log
    assert "==> ort on " in log  # each call's lines under a header naming the engine and the model


def test_in_process_folding_is_quiet(tmp_path):
    """--input-shapes folds constants in this process (onnxruntime's ConstantFolding, then
    onnx-graphsurgeon where that is no pure fold): a constant Reshape that cannot run leaves the
    fold, and the reference run that then fails on it, off the console — the engine's words go
    to engine.log under the call's header."""
    model = make([helper.make_node("Reshape", ["c", "s"], ["bad"], name="r"),
                  helper.make_node("Add", ["x", "bad"], ["y"], name="add")],
                 [vi("x", ["n"])], [vi("y", [4])],
                 [const("c", np.arange(6)), helper.make_tensor("s", 7, [1], [4])])
    save(model, tmp_path / "m.onnx")
    proc = run_cli("check", "m.onnx", "-t", "emulate:fp16", "--input-shapes", "x:4", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr  # the model itself cannot run: said as reprokit's Error
    assert_quiet(proc)
    log = (tmp_path / "out" / "engine.log").read_text()
    assert "==> ort on prepared.onnx" in log
    assert "The input tensor cannot be reshaped" in log
