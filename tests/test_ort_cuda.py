"""ort:cuda[,no-tf32|fp16|bf16] targets and cmd targets that declare their precision (issue 12).

Without onnxruntime-gpu (CI): the spec grammar, the tolerances the precisions set, exit 4 with the
install hint, the refusal of onnxruntime's silent CPU fallback on a real CPU session, the model
the CUDA targets run (converted by reprokit, run here on onnxruntime CPU), and a cmd check at
fp16 through check, pack and verify. Tests marked ``gpu`` run real CUDA kernels and skip here.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import PY, REPO, assert_user_error, cuda_missing, run_cli

from reprokit.api import RunOptions, make_oracle
from reprokit.engine.backends import create_backend
from reprokit.engine.backends.ort_cuda import (
    CUDA,
    convert_for_cuda,
    cuda_provider,
    refuse_cpu_fallback,
)
from reprokit.errors import EngineUnavailable, ExitCode, UsageError
from reprokit.spec import parse_target
from reprokit.standalone.compare import DEFAULT_TOLERANCE

SAMPLES = REPO / "samples"
SAMPLE_NAMES = ["attention_softmax_nan", "conv_clip", "layernorm_overflow", "log_div_underflow",
                "static_batch_broadcast"]


# --- spec grammar and the precision each target runs at ----------------------------------------


@pytest.mark.parametrize("target, precision", [
    ("ort", "fp32"), ("ort:cuda", "tf32"), ("ort:cuda,no-tf32", "fp32"), ("ort:cuda,fp16", "fp16"),
    ("ort:cuda,bf16", "bf16"), ("ort:cuda,fp16,no-tf32", "fp16"), ("ort:cuda,fp16,fp32-nodes=a;Pow_4", "fp16"),
    ("ort:trt", "tf32"), ("ort:trt,fp16", "fp16"),
    ("cmd:python -c pass", "fp32"), ("cmd:precision=fp16:python -c pass", "fp16"),
    ("cmd:precision=bf16:python -c 'print(\"a:b\")' {model}", "bf16"), ("cmd:precision=int8:python -c pass", "int8"),
])
def test_each_target_runs_at_its_precision_and_gets_its_default_tolerance(tmp_path, target, precision):
    spec = parse_target(target)
    assert parse_target(str(spec)) == spec  # printed specs (rerun commands, archives) parse back
    assert create_backend(spec).precision() == precision
    oracle = make_oracle(target, RunOptions(), str(tmp_path))
    assert oracle.criterion.tolerance == DEFAULT_TOLERANCE[precision]


def test_cmd_precision_stays_out_of_the_command():
    spec = parse_target("cmd:precision=fp16:python -c pass {model} --x=1:2")
    assert spec.get("precision") == "fp16" and spec.command == "python -c pass {model} --x=1:2"
    assert str(spec) == "cmd:precision=fp16:python -c pass {model} --x=1:2"
    assert parse_target("cmd:python -c pass").options == ()


@pytest.mark.parametrize("target, words", [
    ("ort:fp16", "needs a GPU provider"), ("ort:bf16", "needs the cuda provider"),
    ("ort:trt,bf16", "needs the cuda provider"), ("ort:no-tf32", "CUDA provider setting"),
    ("ort:cuda,fp16,bf16", "one narrow type"), ("ort:cuda,trt", "one GPU provider"),
    ("ort:cuda,fp32-nodes=a", "only matters on cuda with a narrow type"),
    ("ort:cuda,fp16,fp32-nodes=;", "names no node"),
    ("cmd:precision=fp12:python -c pass", "is none of fp32, tf32, fp16, bf16, int8, fp8"),
    ("cmd:precision=fp16:", "needs a command after its options"),
])
def test_malformed_gpu_and_cmd_specs_are_usage_errors(target, words):
    with pytest.raises(UsageError) as caught:
        parse_target(target)
    assert words in caught.value.message and caught.value.hint


def test_cuda_provider_option_is_onnxruntimes_use_tf32():
    assert cuda_provider(use_tf32=True) == (CUDA, {"use_tf32": "1"})
    assert cuda_provider(use_tf32=False) == (CUDA, {"use_tf32": "0"})
    assert not create_backend(parse_target("ort:cuda,fp16")).deterministic  # shrink replays GPU targets
    assert create_backend(parse_target("ort")).deterministic


# --- no onnxruntime-gpu here: exit 4, the install hint ----------------------------------------


@pytest.mark.parametrize("target", ["ort:cuda,fp16", "ort:cuda,bf16"])
def test_without_onnxruntime_gpu_the_cuda_targets_are_exit_4_with_the_install_hint(target):
    if CUDA in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here: the gpu tests cover these targets")
    sample = SAMPLES / "conv_clip.onnx"
    proc = run_cli("check", str(sample), "--target", target, "--inputs", str(SAMPLES / "conv_clip.inputs.npz"))
    assert_user_error(proc, 4, contains="onnxruntime-gpu is not installed here", hint_contains="reprokit[gpu]")


def test_backends_lists_the_cuda_targets_and_what_they_need():
    proc = run_cli("backends", "--json")
    assert proc.returncode == 0, proc.stderr
    row = {r["engine"]: r for r in json.loads(proc.stdout)["backends"]}["ort"]
    assert {"cuda", "fp16", "bf16", "no-tf32", "fp32-nodes"} <= set(row["options"])
    assert "ort:cuda,fp16" in row["detail"] and "ort:cuda,bf16" in row["detail"]
    if CUDA not in ort.get_available_providers():
        assert "onnxruntime-gpu is not installed" in row["detail"]
    assert "precision" in {r["engine"]: r for r in json.loads(proc.stdout)["backends"]}["cmd"]["options"]


# --- onnxruntime's silent CPU fallback is refused ---------------------------------------------


def test_a_session_that_fell_back_to_the_cpu_is_refused_with_exit_4(tmp_path):
    if CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the fallback needs hidden CUDA libraries (docs/gpu.md)")
    path = models.save(models.small_mlp(), tmp_path / "mlp.onnx")
    # The real thing: onnxruntime asked for CUDA first warns and runs on the CPU.
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        session = ort.InferenceSession(path, providers=[cuda_provider(True), "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(EngineUnavailable) as caught:
        refuse_cpu_fallback(session)
    error = caught.value
    assert error.exit_code == ExitCode.ENVIRONMENT == 4
    assert "CUDAExecutionProvider did not load" in error.message
    assert "CPUExecutionProvider" in error.message and "not reported as a GPU verdict" in error.message
    # what is missing, in the loader's words: this build has no CUDA provider library at all
    assert "libonnxruntime_providers_cuda.so is not part of this onnxruntime build" in error.message
    assert "install the missing libraries" in error.hint


def test_a_session_on_the_wanted_provider_passes(tmp_path):
    path = models.save(models.small_mlp(), tmp_path / "mlp.onnx")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    refuse_cpu_fallback(session, "CPUExecutionProvider")  # no error


# --- the model the CUDA targets run ------------------------------------------------------------


def test_the_cuda_model_is_converted_by_reprokit_with_fp32_io_and_fp32_nodes_by_label(tmp_path):
    # x[1,16] -> MatMul(3e4, unnamed) -> Softmax -> y ; fp32-nodes names the MatMul by OP_INDEX
    model = models.matmul_overflow_softmax()
    model.graph.node[0].name = ""
    path = models.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(0).random((1, 16), dtype=np.float32)
    (expected,) = ort.InferenceSession(path).run(None, {"x": x})
    for keep, matmul_type in ((frozenset(), onnx.TensorProto.FLOAT16), (frozenset({"MatMul_0"}), onnx.TensorProto.FLOAT)):
        meta = {}
        converted = convert_for_cuda(path, "fp16", keep, None, str(tmp_path), meta)
        loaded = onnx.load(converted)
        assert [i.type.tensor_type.elem_type for i in loaded.graph.input] == [onnx.TensorProto.FLOAT]
        assert [o.type.tensor_type.elem_type for o in loaded.graph.output] == [onnx.TensorProto.FLOAT]
        assert meta["converted_to"] == "fp16" and meta["fp32_nodes"] == sorted(keep)
        weights = {t.name: t.data_type for t in loaded.graph.initializer}
        (matmul,) = [n for n in loaded.graph.node if n.op_type == "MatMul"]
        assert weights[matmul.input[1]] == matmul_type  # the kept MatMul reads float32 weights
        (got,) = ort.InferenceSession(converted).run(None, {"x": x})  # fp16 kernels of the CPU build
        np.testing.assert_allclose(got, expected, atol=1e-2)


def test_env_json_records_the_onnxruntime_build():
    from reprokit.engine.envinfo import fingerprint

    env = fingerprint()
    build = env["onnxruntime_build"]
    assert build["version"] == ort.__version__
    assert build["package"] in ("onnxruntime", "onnxruntime-gpu", "onnxruntime_gpu")
    assert ("cuda" in build["provider_libraries"]) == (CUDA in ort.get_available_providers())


# --- a cmd check that declares fp16 ------------------------------------------------------------

CHECK = """\
import sys
import numpy as np
import onnxruntime as ort
model, inputs, outputs = sys.argv[1:4]
feeds = dict(np.load(inputs))
session = ort.InferenceSession(model)
names = [o.name for o in session.get_outputs()]
values = session.run(names, feeds)
# an engine at fp16: every output off by one fp16 rounding step (rel-L2 1e-3)
np.savez(outputs, **{n: (v * np.float32(1 + 2 ** -10)).astype(np.float32) for n, v in zip(names, values)})
"""


def test_cmd_at_fp16_is_judged_at_fp16s_tolerance_through_check_pack_and_repro(tmp_path):
    check = tmp_path / "engine16.py"
    check.write_text(CHECK)
    model = models.save(models.small_mlp(), tmp_path / "mlp.onnx")
    command = f"{PY} {check.name} {{model}} {{inputs}} {{outputs}}"
    declared = run_cli("check", "--json", model, "--target", f"cmd:precision=fp16:{command}", cwd=tmp_path)
    assert declared.returncode == 0, declared.stdout + declared.stderr
    verdict = json.loads(declared.stdout)["verdict"]
    assert verdict["precision"] == "fp16" and verdict["criterion"]["tolerance"] == 1e-2  # fp32's 1e-4 fails it
    assert verdict["target"].startswith("cmd:precision=fp16:")
    # packed with the bundled check script: the archive keeps the declared precision and verifies
    archive = tmp_path / "report.tar.gz"
    packed = run_cli("pack", model, "--target", f"cmd:precision=fp16:{command}", "--tol", "1e-4",
                     "-o", str(archive), cwd=tmp_path)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/verdict.json"))
        recorded = json.load(tar.extractfile(member))
        assert any(m.name.endswith("/check/engine16.py") for m in tar.getmembers())  # bundled
    assert recorded["target"].startswith("cmd:precision=fp16:") and recorded["precision"] == "fp16"
    other = tmp_path / "elsewhere"
    other.mkdir()
    # (verify runs no command an archive names); the standalone repro.py, run by the reader, parses
    # the declared precision away from the command and reproduces at the packed --tol
    with tarfile.open(archive) as tar:
        tar.extractall(other / "x", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (top,) = (other / "x").iterdir()
    import subprocess

    repro = subprocess.run([sys.executable, str(top / "repro.py")], capture_output=True, text=True, timeout=120,
                           cwd=other)
    assert repro.returncode == 1, repro.stdout + repro.stderr


# --- real CUDA kernels (a device run: docs/gpu.md) ---------------------------------------------


def _check_json(sample: str, target: str, *extra: str) -> dict:
    proc = run_cli("check", "--json", str(SAMPLES / f"{sample}.onnx"), "--target", target,
                   "--inputs", str(SAMPLES / f"{sample}.inputs.npz"), *extra, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return json.loads(proc.stdout)["verdict"]


@pytest.mark.gpu
@pytest.mark.parametrize("narrow", ["fp16", "bf16"])
def test_gpu_kernels_diverge_in_the_kind_the_emulator_predicts(narrow):
    real = _check_json("attention_softmax_nan", f"ort:cuda,{narrow}")
    meta = real["target_meta"]
    # op types onnxruntime's CUDA provider has no narrow kernel for ran in float32: the emulator
    # keeps the same nodes
    kept_types = set((meta.get("no_kernel_fp32") or {}).get("op_types") or [])
    kept = [n.name for n in onnx.load(SAMPLES / "attention_softmax_nan.onnx").graph.node if n.op_type in kept_types]
    emulated = _check_json("attention_softmax_nan", f"emulate:{narrow}" + (f",fp32-nodes={';'.join(kept)}" if kept else ""))
    assert real["signature"]["kind"] == emulated["signature"]["kind"], (kept_types, real["signature"])
    assert meta["provider"] == CUDA and meta["converted_to"] == narrow
    assert meta["gpu"]["name"] and meta["gpu"]["compute_capability"]
    assert real["precision"] == narrow


@pytest.mark.gpu
@pytest.mark.parametrize("sample", SAMPLE_NAMES)
def test_gpu_tf32_agrees_on_every_sample(sample):
    verdict = _check_json(sample, "ort:cuda")
    assert verdict["signature"]["kind"] == "agree", verdict["signature"]
    assert verdict["target_meta"]["tf32"] is True
    off = _check_json(sample, "ort:cuda,no-tf32")
    assert off["target_meta"]["provider_options"]["use_tf32"] == "0"


@pytest.mark.gpu
def test_gpu_shrink_and_verify(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("shrink", "--json", str(SAMPLES / "attention_softmax_nan.onnx"), "--target", "ort:cuda,fp16",
                   "--inputs", str(SAMPLES / "attention_softmax_nan.inputs.npz"), "-o", str(out), timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done" and summary["minimal"]["nodes"] <= 3
    verified = run_cli("verify", str(out / "report.tar.gz"), timeout=600)
    assert verified.returncode == 1, verified.stdout + verified.stderr  # reproduces on the GPU


def test_gpu_tests_skip_here_saying_why():
    reason = cuda_missing()
    if reason is None:
        pytest.skip("CUDA works here: the gpu tests run")
    assert reason.startswith("no CUDA provider: onnxruntime-gpu and a GPU needed")
    assert Path(REPO / "pyproject.toml").read_text().count('"gpu:') == 1  # the marker is registered


def test_shrink_replays_gpu_targets_and_audit_sweeps_their_settings():
    from reprokit.audit.sweep import plan
    from reprokit.shrink.budget import default_replays

    assert default_replays("ort") == (0, 0) and default_replays("ort:cuda,fp16") == (1, 1)
    # a check command: the original once (the calibration pack carries it), the result once —
    # twice afresh where its judgement alone comes from the search's cache (issue 39: 4 calls
    # outside the search; final.py)
    assert default_replays("cmd:precision=fp16:true") == (1, 1)
    tried = {s.key: s.target for s in plan("ort:cuda,fp16", [["n1"]], (True, "ok"), None)}
    assert tried["fp32-nodes"] == "ort:cuda,fp16,fp32-nodes=n1"
    assert tried["narrow"] == "ort:cuda,bf16"
    assert tried["no-tf32"] == "ort:cuda,fp16,no-tf32"
    assert tried["fp32"] == "ort:cuda" and tried["fp32-full"] == "ort:cuda,no-tf32"


def test_ops_without_a_narrow_kernel_are_found_kept_in_fp32_and_remembered(tmp_path, monkeypatch):
    """onnxruntime has no bf16 kernel for many ops (its CPU provider even fewer than CUDA's): the
    session of the converted model fails to load; narrow_session finds the op types to keep in
    float32 by trying, says so, and the next run starts from what was found (one try)."""
    import tempfile

    import onnx

    from reprokit.engine.backends.base import BuildError
    from reprokit.engine.backends.ort import make_session
    from reprokit.engine.backends.ort_cuda import narrow_session

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the cache of what was found
    model = str(SAMPLES / "layernorm_overflow.onnx")
    cpu = lambda path: make_session(path, providers=["CPUExecutionProvider"])  # noqa: E731
    with pytest.raises(BuildError):  # the plain conversion does not load on the CPU provider
        cpu(convert_for_cuda(model, "bf16", frozenset(), None, str(tmp_path), {}))
    meta: dict = {}
    session = narrow_session(model, "bf16", frozenset(), None, str(tmp_path), meta, cpu, "CPU provider")
    found = meta["no_kernel_fp32"]
    assert found["op_types"] and found["tries"] > 2
    assert any("no bf16 kernel for" in note and "CPU provider" in note for note in meta["notes"])
    feeds = dict(np.load(SAMPLES / "layernorm_overflow.inputs.npz"))
    assert all(np.all(np.isfinite(out)) for out in session.run(None, feeds))
    # each op type found is needed: keeping all the others in fp32 does not load
    names = {n.op_type: [] for n in onnx.load(model).graph.node}
    for node in onnx.load(model).graph.node:
        names[node.op_type].append(node.name)
    for op_type in found["op_types"]:
        others = frozenset(n for t in found["op_types"] if t != op_type for n in names[t])
        with pytest.raises(BuildError):
            cpu(convert_for_cuda(model, "bf16", others, None, str(tmp_path), {}))
    again: dict = {}
    narrow_session(model, "bf16", frozenset(), None, str(tmp_path), again, cpu, "CPU provider")
    assert again["no_kernel_fp32"]["tries"] == 1 and again["no_kernel_fp32"]["op_types"] == found["op_types"]


def test_a_model_that_fails_for_another_reason_keeps_its_own_error(tmp_path, monkeypatch):
    import tempfile

    from reprokit.engine.backends.base import BuildError
    from reprokit.engine.backends.ort import make_session
    from reprokit.engine.backends.ort_cuda import narrow_session

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    calls = []

    def refuse(path):  # an engine that refuses every model it is given
        calls.append(path)
        return make_session(str(tmp_path / "missing.onnx"))

    with pytest.raises(BuildError, match="could not load"):
        narrow_session(str(SAMPLES / "conv_clip.onnx"), "fp16", frozenset(), None, str(tmp_path), {}, refuse)
    assert len(calls) == 2  # as converted, then with every op type in fp32: no search


def test_issue_text_names_the_onnxruntime_and_cudnn_the_target_really_used():
    """On the H100 the image's CPU onnxruntime 1.30.0 metadata sat beside the imported
    onnxruntime-gpu 1.31.1, and pip's nvidia-cudnn said 9.19 while the process loaded the system's
    9.14: the title said "ONNX Runtime 1.30.0" and CUDNN 9.19. The imported build and the loaded
    libraries win."""
    from reprokit.report.describe import engine_label, environment_lines
    from reprokit.spec import parse_target

    env = {"packages": {"onnxruntime": "1.30.0"}, "tensorrt": {"version": None}, "cudnn": "9.19.0.56",
           "cuda_runtime": "13.1", "onnxruntime_build": {"package": "onnxruntime-gpu", "version": "1.31.1"}}
    assert engine_label(parse_target("ort:cuda,fp16"), env) == "ONNX Runtime 1.31.1 (onnxruntime-gpu)"
    lines = environment_lines(env, {"cudnn_loaded": "9.14.0", "cuda_runtime_loaded": "13.0"})
    assert lines["cudnn"].startswith("9.14.0") and lines["cuda"].startswith("13.0")
    assert environment_lines(env)["cudnn"] == "9.19.0.56"  # no target process: what is installed
    assert engine_label(parse_target("ort"), {"packages": {"onnxruntime": "1.32.0"},
                                              "onnxruntime_build": "not available"}) == "ONNX Runtime 1.32.0"
