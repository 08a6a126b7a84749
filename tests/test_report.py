"""The report archive: members, manifest, a repro.py that runs without reprokit and gives the
same numbers, verify, redaction (with the still-reproduces check), and a golden ISSUE.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import pack_matmul_softmax

from reprokit.api import RunOptions
from reprokit.report.archive import check_manifest, safe_extract
from reprokit.report.bundle import pack
from reprokit.report.verify import verify
from tests.models import bf16_steps, matmul_overflow_softmax, save

GOLDEN = Path(__file__).parent / "golden"
MEMBERS = {"model.onnx", "model.fp16.onnx", "inputs.npz", "inputs.json", "reference_outputs.npz", "target_outputs.npz",
           "verdict.json", "env.json", "repro.py", "commands.sh", "ISSUE.md", "README.md", "MANIFEST.json",
           "logs/polygraphy_inspect_model.log", "logs/polygraphy_run_onnxrt.log", "logs/repro.log",
           "logs/target_emulate.log", "inputs/input_0.bin"}
# Runs repro.py with reprokit made unimportable: any `import reprokit` fails.
NO_REPROKIT = "import runpy, sys; sys.modules['reprokit'] = None; sys.argv = ['repro.py'] + sys.argv[1:]; runpy.run_path('repro.py', run_name='__main__')"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """The MatMul→Softmax archive (conftest.pack_matmul_softmax), packed once for the module."""
    folder = tmp_path_factory.mktemp("pack")
    result = pack_matmul_softmax(folder)
    top = safe_extract(result.archive, str(folder / "x"))
    return result, Path(top)


def test_archive_holds_the_documented_members_under_one_top_folder(archive):
    result, top = archive
    with tarfile.open(result.archive) as tar:
        names = tar.getnames()
    assert {n.split("/", 1)[0] for n in names} == {"report"}
    assert {n.split("/", 1)[1] for n in names} == MEMBERS
    assert check_manifest(str(top)) == []
    verdict = json.loads((top / "verdict.json").read_text())
    assert verdict["signature"]["kind"] == "nonfinite" and verdict["criterion"]["tolerance"] == 1e-2
    env = json.loads((top / "env.json").read_text())
    assert {"tensorrt", "gpu", "os", "python", "packages", "cpu", "container"} <= set(env)
    assert env["packages"]["onnxruntime"]


def test_repro_runs_without_reprokit_and_prints_the_same_numbers(archive):
    result, top = archive
    done = subprocess.run([sys.executable, "-c", NO_REPROKIT], cwd=top, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCES: nonfinite" in done.stdout
    recorded = json.loads((top / "verdict.json").read_text())["outputs"][0]
    row = next(line for line in done.stdout.splitlines() if line.startswith(recorded["name"]))
    nan_count = int(row.split()[3])
    assert nan_count == recorded["target_nan"] > 0


def test_repro_with_a_setting_that_agrees_exits_0(archive):
    _, top = archive
    done = subprocess.run([sys.executable, "-c", NO_REPROKIT, "--target", "ort"], cwd=top,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DOES NOT REPRODUCE" in done.stdout


def test_verify_reproduces_and_not_with_another_target(archive):
    result, _ = archive
    here = verify(result.archive)
    assert here.reproduces and here.verdict.kind.value == "nonfinite"
    other = verify(result.archive, "ort")
    assert not other.reproduces


def test_issue_text_has_the_template_headings_and_the_numbers(archive):
    _, top = archive
    text = (top / "ISSUE.md").read_text()
    for heading in ("## Description", "## Environment", "## Relevant Files", "## Steps To Reproduce",
                    "## Have you tried [the latest release]", "## Can this model run on other frameworks?"):
        assert heading in text
    assert text.startswith("# NaN output failure of reprokit's fp16 storage emulator")
    assert "MatMul" in text and "Softmax" in text and "REPRODUCES" in text
    assert "polygraphy run model.onnx --trt --fp16" in text


def test_redact_with_random_weights_when_they_still_reproduce(tmp_path):
    model = save(matmul_overflow_softmax(), tmp_path / "secret_model.onnx")
    result = pack(model, "emulate:fp16", str(tmp_path / "r.tar.gz"), options=RunOptions(seed=3), redact=True)
    assert result.redaction["weights"].startswith("replaced")
    assert result.redaction["verdict_before"] == result.redaction["verdict_after"] == "nonfinite (nan)"
    top = Path(safe_extract(result.archive, str(tmp_path / "x")))
    redacted = onnx.load(top / "model.onnx")
    names = {n.name for n in redacted.graph.node} | {t.name for t in redacted.graph.initializer}
    assert not any("matmul" in n or n == "W" for n in names)
    assert not redacted.metadata_props and not redacted.doc_string
    env = json.loads((top / "env.json").read_text())
    assert env["hostname"] == env["user"] == env["cwd"] == "<redacted>"
    for member in top.rglob("*"):
        if member.is_file() and member.suffix in (".md", ".json", ".log", ".py", ".sh"):
            text = member.read_text(errors="replace")
            # node names were lowercase 'matmul'/'softmax' (op types are 'MatMul'/'Softmax')
            assert "secret_model" not in text and "matmul" not in text and "softmax" not in text, member


def test_redact_keeps_weights_loudly_when_random_ones_do_not_reproduce(tmp_path):
    """bf16 loses the 1e-3 steps of alternating-sign weights; random weights of the same mean and
    std carry no such cancellation, so only the real weights reproduce."""
    model = save(bf16_steps(), tmp_path / "m.onnx")
    result = pack(model, "emulate:bf16", str(tmp_path / "r.tar.gz"), options=RunOptions(seed=0), redact=True)
    assert result.redaction["weights"] == "KEPT"
    assert any("NOT reproduce" in note and "KEPT" in note for note in result.notes)
    top = Path(safe_extract(result.archive, str(tmp_path / "x")))
    weights = [onnx.numpy_helper.to_array(t) for t in onnx.load(top / "model.onnx").graph.initializer]
    original = [onnx.numpy_helper.to_array(t) for t in onnx.load(model).graph.initializer]
    assert all(np.array_equal(a, b) for a, b in zip(weights, original, strict=True))


def test_repro_names_openvino_outputs_as_the_model_does(tmp_path, ov_bf16):
    """Found packing silero-vad under openvino:bf16: its output `output` comes out of OpenVINO on a
    port named {output, /model/ReduceMean_output_0}, repro.py took get_any_name() and said "the
    target produced no output named 'output'" (exit 2) for an archive whose check reproduces."""
    # x[1,256] -> MatMul(bf16_steps' W) -> a -> Identity -> y[1,1]   (one OpenVINO port: {a, y})
    model = bf16_steps()
    model.graph.node[0].output[0] = "a"
    model.graph.node.append(onnx.helper.make_node("Identity", ["a"], ["y"], name="id"))
    path = save(model, tmp_path / "m.onnx")
    result = pack(path, "openvino:bf16", str(tmp_path / "r.tar.gz"), options=RunOptions(seed=0))
    top = Path(safe_extract(result.archive, str(tmp_path / "x")))
    done = subprocess.run([sys.executable, "repro.py"], cwd=top, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCES: mismatch" in done.stdout


def test_issue_md_golden(tmp_path):
    """ISSUE.md rendered from fixed values; UPDATE_GOLDEN=1 rewrites the golden file."""
    from reprokit.engine.oracle import Kind, Signature, Verdict
    from reprokit.report.render import render
    from reprokit.standalone.compare import Criterion, compare_arrays

    ref = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    error = compare_arrays("y", ref, np.full_like(ref, np.nan), Criterion())
    verdict = Verdict(Signature(Kind.NONFINITE, ("y",), "nan"), (error,), Criterion(), "ort", "trt:fp16", "fp16",
                      target_meta={"mode": "weakly-typed", "builder_flags": ["TF32", "FP16"],
                                   "built_file": "model.onnx"})
    from reprokit.report import describe
    from reprokit.report.trtcommands import trt_values

    env = {"tensorrt": {"distribution": "tensorrt", "version": "10.0.1.6"},
           "gpu": [{"name": "NVIDIA L4", "compute_capability": "8.9", "driver": "550.54"}],
           "cuda_runtime": "12.4", "cudnn": "9.1", "os": "Linux 5.15", "os_release": "Ubuntu 22.04",
           "machine": "x86_64", "python": "3.10.12", "packages": {"torch": "2.3.0", "onnxruntime": "1.18.0"},
           "container": "bare metal (no container detected)", "cpu": "x"}
    model = matmul_overflow_softmax()
    from reprokit.spec import parse_target

    spec = parse_target("trt:fp16")
    text = render("ISSUE.md.j2", title=describe.title(verdict, spec, env, ["MatMul", "Softmax"]), verdict=verdict,
                  description=describe.describe(verdict, spec, model, {"original_nodes": 230, "minimal_nodes": 2,
                                                                        "calls": 3, "one_minimal": True}),
                  context={"original_nodes": 230, "minimal_nodes": 2, "calls": 3, "one_minimal": True},
                  mode="weakly-typed", sweep=[], env_lines=describe.environment_lines(env),
                  archive_name="report.tar.gz", nodes=2, ops=["MatMul", "Softmax"], opset=17,
                  engine_packages="tensorrt polygraphy", repro_output="REPRODUCES\n[exit code 1]",
                  polygraphy_command=describe.polygraphy_command(spec, verdict, model),
                  latest_release="Reproduced with TensorRT 10.0.1.6.", other_frameworks="Yes.",
                  **trt_values(spec, verdict, model, {}, env, "tensorrt polygraphy",
                               {"schema_fp32": [], "clamped": ["W"]}))
    golden = GOLDEN / "ISSUE.md"
    if os.environ.get("UPDATE_GOLDEN") == "1" or not golden.exists():
        golden.write_text(text)
    assert text == golden.read_text()


def test_a_command_started_beside_another_is_bounded_and_never_outlives_its_step(tmp_path):
    """pack starts repro.py and polygraphy's runs at once (report/reprorun.Started): a run past
    its timeout is killed and reads as subprocess.run's would (124, "timed out after"), one that
    finishes gives its exit code and output, and a step left early (an interrupt) kills what it
    started; no output file stays behind."""
    import time

    from reprokit.report.reprorun import Started

    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    slow = Started(sleeper, str(tmp_path), str(tmp_path), timeout=2.0)
    done = Started([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], str(tmp_path), str(tmp_path), 60)
    began = time.monotonic()
    timed_out = slow.result()
    assert timed_out.returncode == 124 and "timed out after 2.0 s" in timed_out.stderr and "started" in timed_out.stdout
    assert time.monotonic() - began < 30 and slow.process.poll() is not None
    finished = done.result()
    assert (finished.returncode, finished.stdout.strip()) == (3, "out")
    with pytest.raises(KeyboardInterrupt):
        with Started(sleeper, str(tmp_path), str(tmp_path), timeout=60) as left:
            raise KeyboardInterrupt
    assert left.process.poll() is not None
    assert os.listdir(tmp_path) == []
