"""What reprokit tells the user about the reference itself: a degenerate reference (near zero
everywhere, constant) makes relative error meaningless; an opset onnxruntime no longer runs has
an upgrade path. Real engines, real models."""

from __future__ import annotations

import json
import shlex
import subprocess
import tarfile

import models
import numpy as np
import onnx
from onnx import helper


def saturated_sigmoid(n: int = 64) -> onnx.ModelProto:
    """A detection head on random feeds: sigmoid of logits near -14, outputs of about 1e-6 (as
    PP-OCRv4 det's are): fp16 stores them as subnormals, and rel-L2 blows that up."""
    # x[1,n] in [0,1) -> MatMul(W ~ N(0, 0.05)) -> Add(-14) -> Sigmoid -> y
    rng = np.random.default_rng(11)
    return models.make(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="head"),
         helper.make_node("Add", ["h", "bias"], ["logits"], name="bias"),
         helper.make_node("Sigmoid", ["logits"], ["y"], name="sigmoid")],
        [models.vi("x", [1, n])], [models.vi("y", [1, n])],
        [models.const("W", rng.normal(0, 0.05, (n, n))), models.const("bias", np.full(n, -14.0))])


def test_check_warns_that_a_near_zero_reference_makes_relative_error_meaningless(tmp_path, cli):
    path = models.save(saturated_sigmoid(), tmp_path / "det.onnx")
    proc = cli("check", path, "--target", "emulate:fp16", "--json")
    assert proc.returncode == 1, proc.stderr
    payload = json.loads(proc.stdout)
    (warning,) = payload["warnings"]
    assert "'y'" in warning and "near zero everywhere" in warning and "--metric max-abs" in warning
    assert payload["verdict"]["warnings"] == payload["warnings"]
    assert payload["verdict"]["outputs"][0]["reference_note"].startswith("near zero")
    human = cli("check", path, "--target", "emulate:fp16")
    assert "warning" in human.stdout and "relative error is meaningless" in " ".join(human.stdout.split())
    # an absolute metric is what the warning suggests: no near-zero warning under it
    absolute = cli("check", path, "--target", "emulate:fp16", "--metric", "max-abs", "--json")
    assert absolute.returncode == 0 and json.loads(absolute.stdout)["warnings"] == []


def test_a_healthy_reference_gets_no_warning(model_file, cli):
    proc = cli("check", model_file("small_mlp"), "--target", "emulate:fp16", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["warnings"] == []


def test_shrink_and_pack_carry_the_warning_into_summary_and_issue(tmp_path, cli):
    path = models.save(saturated_sigmoid(), tmp_path / "det.onnx")
    out = tmp_path / "out"
    proc = cli("shrink", path, "--target", "emulate:fp16", "-o", str(out), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["warnings"] and "near zero everywhere" in summary["warnings"][0]
    with tarfile.open(summary["report"]) as archive:
        issue = next(m for m in archive.getmembers() if m.name.endswith("/ISSUE.md"))
        text = archive.extractfile(issue).read().decode()
    assert "**Warning:** reference output 'y' is near zero everywhere" in text
    packed = cli("pack", str(out / "minimal.onnx"), "--target", "emulate:fp16", "--inputs",
                 str(out / "inputs.npz"), "-o", str(tmp_path / "report.tar.gz"), "--json", timeout=300)
    assert packed.returncode == 0, packed.stderr
    assert any("near zero everywhere" in note for note in json.loads(packed.stdout)["notes"])


def add_opset6() -> onnx.ModelProto:
    """Add at opset 6, as old PyTorch exporters wrote it: onnxruntime has no kernel for it."""
    # a[2,3], b[2,3] -> Add-6 -> y
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "old",
                              [models.vi("a", [2, 3]), models.vi("b", [2, 3])], [models.vi("y", [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)
    onnx.checker.check_model(model)
    return model


def test_an_old_opset_reference_failure_hints_the_exact_upgrade_and_the_upgrade_works(tmp_path, cli):
    path = tmp_path / "old.onnx"
    onnx.save(add_opset6(), path)
    before = path.read_bytes()
    proc = cli("check", str(path), "--target", "emulate:fp16")
    assert proc.returncode == 5, proc.stderr
    hint = next(line for line in proc.stderr.splitlines() if line.startswith("Hint: "))
    assert "opset 6" in hint and "version_converter.convert_version(" in hint
    command = shlex.split(hint.split("convert a copy and check that: ", 1)[1])
    assert command[:2] == ["python", "-c"]
    subprocess.run(["python3", *command[1:]], check=True, capture_output=True, timeout=120)
    assert path.read_bytes() == before  # the user's file is never written
    upgraded = tmp_path / "old.opset13.onnx"
    again = cli("check", str(upgraded), "--target", "emulate:fp16", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["verdict"]["signature"]["kind"] == "agree"
    assert onnx.load(upgraded).opset_import[0].version == 13
