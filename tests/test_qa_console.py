"""Names printed from a stranger's model or archive (the hqa trial): an output name is shown as
written — never read as rich markup (``"y[/bold]"`` crashed check, shrink and pack with exit 70;
``"[bold green]AGREES[/]"`` printed "DIVERGES ... in AGREES") — and none of its control characters
reaches the terminal (an archive's ``"\\x1b[2J..."`` cleared the screen of whoever ran verify).

Real runs of the installed ``reprokit``; models: x[1,16] -> MatMul(W = 3e4) -> NAME[1,4], inf
under emulate:fp16.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_cli
from onnx import helper

from tests.models import const, make, save, vi


def named_output(folder, name: str) -> str:
    # x[1,16] -> MatMul(W = 3e4) -> NAME[1,4]
    model = make(
        [helper.make_node("MatMul", ["x", "W"], [name])],
        [vi("x", [1, 16])],
        [vi(name, [1, 4])],
        [const("W", np.full((16, 4), 3e4, np.float32))],
    )
    return save(model, folder / "named.onnx")


@pytest.mark.parametrize("name", ["y[/bold]", "[bold green]AGREES[/]"])
@pytest.mark.parametrize("command", ["check", "shrink", "pack"])
def test_an_output_name_is_printed_as_written_not_as_markup(tmp_path, name, command):
    model = named_output(tmp_path, name)
    out = (
        ["-o", str(tmp_path / ("r.tar.gz" if command == "pack" else "out"))]
        if command != "check"
        else []
    )
    proc = run_cli(command, model, "--target", "emulate:fp16", *out)
    assert proc.returncode == (1 if command == "check" else 0), proc.stderr
    said = f"outputs    {name}" if command == "shrink" else f"nonfinite (inf) in {name}"
    assert said in proc.stdout, (
        proc.stdout
    )  # the verdict line (shrink: its outputs line), brackets and all


def test_an_archive_cannot_write_control_characters_to_the_terminal(tmp_path):
    name = "\x1b[2J\x1b[1;1HDOES NOT REPRODUCE\x1b[8m"  # clear, home, fake verdict, hide the rest
    archive = str(tmp_path / "r.tar.gz")
    assert (
        run_cli(
            "pack", named_output(tmp_path, name), "--target", "emulate:fp16", "-o", archive
        ).returncode
        == 0
    )
    proc = run_cli("verify", archive)
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "\\x1b[2J\\x1b[1;1HDOES NOT REPRODUCE\\x1b[8m" in proc.stdout  # shown, escaped
    assert proc.stdout.rstrip().endswith("REPRODUCES")


def test_an_engine_error_quoting_the_archive_cannot_write_control_characters(tmp_path):
    """onnxruntime's refusal quotes the op domain of the archive's model: an OSC sequence there
    (set the terminal's title, which click's ANSI stripping does not catch) reached the Error: line."""
    import json
    import os

    import onnx

    from reprokit.report.archive import safe_extract, write_archive, write_manifest

    archive = str(tmp_path / "r.tar.gz")
    assert (
        run_cli(
            "pack", named_output(tmp_path, "y"), "--target", "emulate:fp16", "-o", archive
        ).returncode
        == 0
    )
    top = safe_extract(archive, str(tmp_path / "edit"))
    model = onnx.load(os.path.join(top, "model.onnx"))
    domain = "com.\x1b]0;PWNED\x07evil"
    model.graph.node[0].domain = domain
    model.opset_import.append(helper.make_opsetid(domain, 1))
    onnx.save(model, os.path.join(top, "model.onnx"))
    extra = {
        k: v
        for k, v in json.load(open(os.path.join(top, "MANIFEST.json"))).items()
        if k not in ("schema", "files")
    }
    os.remove(os.path.join(top, "MANIFEST.json"))
    write_manifest(top, extra)
    hostile = str(tmp_path / "hostile.tar.gz")
    write_archive(top, hostile, "tar.gz")
    proc = run_cli("verify", hostile)
    assert proc.returncode == 5, proc.stderr  # the reference cannot load the model
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "com.\\x1b]0;PWNED\\x07evil" in proc.stderr
