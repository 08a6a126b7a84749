"""ISSUE.md in each upstream's own form (issue 27): OpenVINO's bug.yml fields for ``openvino``,
onnxruntime's issue form for ``ort``/``ort:cuda``, TensorRT's for ``trt`` (tests/test_report.py
holds that golden). Rendered from fixed values; UPDATE_GOLDEN=1 rewrites the golden files. And a
real OpenVINO archive: its ISSUE.md follows OpenVINO's template, with benchmark_app in it."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from reprokit.engine.oracle import Kind, Signature, Verdict
from reprokit.report import describe
from reprokit.report.render import render
from reprokit.report.trtcommands import trt_values
from reprokit.report.upstream import issue_template, upstream_values
from reprokit.spec import parse_target
from reprokit.standalone.compare import Criterion, compare_arrays

GOLDEN = Path(__file__).parent / "golden"
ENV = {"tensorrt": {"distribution": None, "version": None}, "gpu": None, "os": "Linux 6.1", "machine": "x86_64",
       "os_release": "Ubuntu 22.04.4 LTS", "python": "3.11.7", "cpu": "Intel(R) Xeon(R)",
       "packages": {"onnxruntime": "1.26.0", "openvino": "2025.0.0"}, "container": "docker"}
FIELDS = {
    "openvino": ["### OpenVINO Version\n\n2025.0.0\n", "### Device used for inference\n\nCPU\n",
                 "### Framework\n\nONNX\n", "benchmark_app -m model.onnx -d CPU -hint none -infer_precision f32",
                 "### Relevant log output\n\n```shell\n", "### Issue submission checklist"],
    "ort:opt": ["### ONNX Runtime Version or Commit ID\n\n1.26.0\n", "### Platform\n\nLinux\n",
                "### Architecture\n\nX64\n", "### Execution Provider\n\nDefault CPU\n",
                "onnxruntime_perf_test -e cpu -o 99 -r 1 -I model.onnx", "ORT_ENABLE_ALL"],
}


def _render(target: str) -> str:
    spec = parse_target(target)
    ref = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    error = compare_arrays("y", ref, ref + 0.5, Criterion())
    verdict = Verdict(Signature(Kind.MISMATCH, ("y",), ""), (error,), Criterion(), "ort", target, "fp32",
                      target_meta={})
    from models import small_mlp

    model = small_mlp()
    ops = sorted({n.op_type for n in model.graph.node})
    values = dict(title=describe.title(verdict, spec, ENV, ops), verdict=verdict, context=None, sweep=[],
                  description=describe.describe(verdict, spec, model, None), mode=spec.engine,
                  env_lines=describe.environment_lines(ENV), archive_name="report.tar.gz",
                  nodes=len(model.graph.node), ops=ops, opset=17, engine_packages="openvino"
                  if spec.engine == "openvino" else "", repro_output="REPRODUCES\n[exit code 1]",
                  polygraphy_command="polygraphy run model.onnx --onnxrt", other_frameworks="Yes.",
                  latest_release="(replaced)")
    values.update(upstream_values(spec, ENV))
    values.update(trt_values(spec, verdict, model, {}, ENV, values["engine_packages"]))
    return render(issue_template(spec), **values)


@pytest.mark.parametrize("target,golden", [("openvino:f32", "ISSUE-openvino.md"), ("ort:opt", "ISSUE-ort.md")])
def test_issue_form_golden(target, golden):
    text = _render(target)
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
    assert text == path.read_text()
    for field in FIELDS[target if target != "openvino:f32" else "openvino"]:
        assert field in text
    assert "TensorRT" not in text and "developer.nvidia.com" not in text


def test_templates_by_engine():
    assert [issue_template(parse_target(t)) for t in ("trt:fp16", "emulate:fp16", "openvino", "ort:cuda", "ort")] == [
        "ISSUE.md.j2", "ISSUE.md.j2", "ISSUE-openvino.md.j2", "ISSUE-ort.md.j2", "ISSUE-ort.md.j2"]


def test_ort_cuda_names_the_execution_provider_and_its_libraries():
    values = upstream_values(parse_target("ort:cuda,fp16"),
                             {**ENV, "onnxruntime_build": {"cuda_version": "12.4", "cudnn_version": "9.1"}})
    assert (values["ort_ep"], values["ort_ep_version"]) == ("CUDA", "CUDA 12.4, cuDNN 9.1")
    assert values["engine_command"].startswith("onnxruntime_perf_test -e cuda -o 0")


@pytest.mark.slow
def test_an_openvino_archive_follows_openvinos_template(tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "samples" / "matrix"))
    import make_avgpool_ceil

    from reprokit.report.bundle import pack

    model, inputs = make_avgpool_ceil.write(str(tmp_path))
    from reprokit.api import RunOptions

    # OpenVINO divides the trailing ceil_mode window by the whole kernel (3 cells of padding
    # counted as 7 cells); onnxruntime >= 1.29 by the cells inside input + padding.
    result = pack(model, "openvino:f32", str(tmp_path / "ov.tar.gz"), options=RunOptions(inputs=inputs))
    assert result.reproduces
    with tarfile.open(result.archive) as handle:
        issue = handle.extractfile(next(m for m in handle.getmembers() if m.name.endswith("/ISSUE.md"))).read().decode()
    assert issue.startswith("# [Bug]: ")
    for field in FIELDS["openvino"][1:4] + ["### Issue description", "### Step by step reproduction",
                                             "### Have you tried the latest release?"]:
        assert field in issue
    assert "TensorRT" not in issue


@pytest.mark.parametrize("target,template", [("ort:opt", "ISSUE-ort.md.j2"), ("trt:fp16", "ISSUE.md.j2")])
def test_an_openvino_reference_is_named_as_openvino(target, template):
    """An archive checked against OpenVINO (``--reference openvino:f32``, as docs/matrix.md packs the
    AveragePool case) names OpenVINO in its description, findings and "other frameworks" answer."""
    from reprokit.report.bundle import _other_frameworks

    spec = parse_target(target)
    ref = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    verdict = Verdict(Signature(Kind.MISMATCH, ("y",), ""), (compare_arrays("y", ref, ref + 0.5, Criterion()),),
                      Criterion(), "openvino:f32", target, "fp32", target_meta={})
    from models import small_mlp

    model = small_mlp()
    description = describe.describe(verdict, spec, model, None)
    assert "differs from OpenVINO (CPU, f32)" in description and "ONNX Runtime" not in description
    values = dict(title=describe.title(verdict, spec, ENV, ["MatMul"]), verdict=verdict, context=None, sweep=[],
                  description=description, mode=spec.engine, env_lines=describe.environment_lines(ENV),
                  archive_name="report.tar.gz", nodes=3, ops=["MatMul"], opset=17, engine_packages="",
                  repro_output="REPRODUCES\n[exit code 1]", polygraphy_command="polygraphy run model.onnx --onnxrt",
                  other_frameworks=_other_frameworks(ENV, verdict.reference), latest_release="(replaced)")
    values.update(upstream_values(spec, ENV))
    values.update(trt_values(spec, verdict, model, {}, ENV, ""))
    text = render(template, **values)
    assert "reference: `openvino:f32` (OpenVINO, CPU, f32)" in text
    assert "ONNX Runtime (CPU, fp32)" not in text and "ONNX Runtime, CPU, fp32" not in text
    if template == "ISSUE.md.j2":  # TensorRT's form asks whether another framework runs it
        assert "Yes. OpenVINO 2025.0.0 (CPU, f32) runs the model" in text


def test_reference_words_follow_the_spec():
    assert [describe.reference_words(r) for r in ("ort", "ort:cuda,fp16", "openvino", "emulate:bf16")] == [
        "ONNX Runtime (CPU, fp32)", "ONNX Runtime (CUDA, fp16)", "OpenVINO (CPU, bf16)",
        "reprokit's storage emulator (bf16)"]


@pytest.mark.slow
def test_an_archive_packed_against_openvino_says_so(tmp_path):
    """samples/matrix/make_avgpool_ceil.py packed with ``--target ort --reference openvino:f32``
    (onnxruntime >= 1.29 and OpenVINO divide the trailing ceil_mode window differently): the real
    archive's ISSUE.md names OpenVINO as what onnxruntime differs from, never ONNX Runtime."""
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "samples" / "matrix"))
    import make_avgpool_ceil

    from reprokit.api import RunOptions
    from reprokit.report.bundle import pack

    model, inputs = make_avgpool_ceil.write(str(tmp_path))
    result = pack(model, "ort", str(tmp_path / "ovref.tar.gz"), options=RunOptions(inputs=inputs, reference="openvino:f32"))
    if not result.reproduces:
        pytest.skip("this onnxruntime agrees with OpenVINO on the model (the ceil_mode fix is in onnxruntime >= 1.29)")
    with tarfile.open(result.archive) as handle:
        issue = handle.extractfile(next(m for m in handle.getmembers() if m.name.endswith("/ISSUE.md"))).read().decode()
    assert "differs from OpenVINO (CPU, f32)" in issue
    assert "reference: `openvino:f32` (OpenVINO, CPU, f32)" in issue and "ONNX Runtime (CPU, fp32)" not in issue
