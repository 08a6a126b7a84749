"""``--torch FILE.py:FUNC``: modules from tests/torch_models.py exported with torch.onnx.export and
judged in three columns — PyTorch eager, onnxruntime (the ONNX reference), the target (the fp16
storage emulator) — so a divergence is blamed on the exporter or on the engine. Real torch, real
exporters, real engines; skipped with the reason where torch is not installed."""

from __future__ import annotations

import importlib.util
import json
import tarfile

import pytest
from conftest import REPO, assert_user_error, run_cli

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install 'reprokit[torch]')")
MODELS = str(REPO / "tests" / "torch_models.py")


def _check(tmp_path, func: str, *extra: str):
    proc = run_cli("check", "--torch", f"{MODELS}:{func}", "--target", "emulate:fp16", "-o", str(tmp_path / "out"),
                   "--json", *extra, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc, json.loads(proc.stdout)


@needs_torch
@pytest.mark.slow
def test_small_cnn_three_columns_with_the_default_exporter(tmp_path):
    import torch

    proc, payload = _check(tmp_path, "small_cnn")
    columns = payload["torch"]
    export = columns["export"]
    assert export["torch"] == torch.__version__ and export["exporter"] == "torch.onnx.export"
    assert export["dynamo"] is (importlib.util.find_spec("onnxscript") is not None)
    assert isinstance(export["opset"], int) and export["opset"] >= 13
    # Three columns over the same outputs: eager→onnxruntime, onnxruntime→target, eager→target.
    names = [o["name"] for o in columns["exporter"]["outputs"]]
    assert names and names == [o["name"] for o in columns["engine"]["outputs"]] \
        == [o["name"] for o in columns["end_to_end"]["outputs"]]
    assert columns["exporter"]["outputs"][0]["rel_l2"] < 1e-5  # fp32 against fp32
    assert columns["blame"] == "none" and proc.returncode == 0
    folder = tmp_path / "out" / "torch"
    recorded = json.loads((folder / "export.json").read_text())
    assert recorded["source"].endswith("torch_models.py:small_cnn")
    assert {p.name for p in folder.iterdir()} >= {"model.onnx", "inputs.npz", "eager_outputs.npz", "export.log"}


@needs_torch
def test_transformer_block_overflow_is_the_engine():
    proc = run_cli("check", "--torch", f"{MODELS}:transformer_block_overflow", "--torch-exporter", "legacy",
                   "--target", "emulate:fp16", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for header in ("torch → onnxruntime", "onnxruntime → target", "torch → target"):
        assert header in proc.stdout
    assert "legacy TorchScript" in proc.stdout
    assert "the ENGINE diverges" in proc.stdout  # attention logits past fp16's max; the export is right


@needs_torch
def test_planted_exporter_bug_is_named_the_exporter(tmp_path):
    """An autograd.Function whose symbolic exports x*sigmoid(2x) for an eager x*sigmoid(x)."""
    proc, payload = _check(tmp_path, "planted_exporter_bug", "--torch-exporter", "legacy")
    columns = payload["torch"]
    assert columns["export"]["dynamo"] is False and proc.returncode == 1
    assert columns["blame"] == "exporter" and columns["words"].startswith("the EXPORTER diverges")
    assert columns["exporter"]["signature"]["kind"] == "mismatch" and columns["engine"]["diverges"] is False
    assert columns["exporter"]["outputs"][0]["rel_l2"] > 0.05
    assert columns["end_to_end"]["diverges"] is True


@needs_torch
@pytest.mark.slow
def test_pack_archive_records_torch_and_export_settings(tmp_path):
    import torch

    archive = tmp_path / "report.tar.gz"
    proc = run_cli("pack", "--torch", f"{MODELS}:transformer_block_overflow", "--torch-exporter", "legacy",
                   "--target", "emulate:fp16", "-o", str(archive), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        torch_json = json.load(tar.extractfile(next(n for n in names if n.endswith("/torch.json"))))
        manifest = json.load(tar.extractfile(next(n for n in names if n.endswith("MANIFEST.json"))))
    assert torch_json["export"]["torch"] == torch.__version__ and torch_json["export"]["dynamo"] is False
    assert torch_json["exporter_diverges"] is False
    assert manifest["torch"] == {"torch": torch.__version__, "exporter": "torch.onnx.export", "dynamo": False,
                                 "opset": torch_json["export"]["opset"]}
    assert (tmp_path / "report.torch" / "model.onnx").exists()


def test_without_torch_exit_4_with_a_hint(tmp_path):
    """torch shadowed by a package that cannot be imported: what a machine without torch sees."""
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    proc = run_cli("check", "--torch", f"{MODELS}:small_cnn", "--target", "emulate:fp16",
                   env={"PYTHONPATH": str(tmp_path / "shadow")})
    error, hint = assert_user_error(proc, 4, contains="--torch needs PyTorch")
    assert "reprokit[torch]" in hint


def test_torch_usage_errors(tmp_path, model_file):
    assert_user_error(run_cli("check", "--torch", "nowhere.py:f", "--target", "emulate:fp16"), 2,
                      contains="no file nowhere.py")
    assert_user_error(run_cli("check", "--torch", "no-function-given", "--target", "emulate:fp16"), 2,
                      contains="is not FILE.py:FUNC")
    path = model_file("small_mlp")
    assert_user_error(run_cli("check", path, "--torch", f"{MODELS}:small_cnn", "--target", "emulate:fp16"), 2,
                      contains="not both")
