"""A printed TensorRT command runs as printed on the versions it names. Every trtexec line an
archive prints (both typings, every kind of ``trt``/``emulate`` target, models with and without
Q/DQ) is checked option by option against the options trtexec's own parser takes at each release
of the version lines its form names (tests/golden/trtexec_flags.json, read from NVIDIA/TensorRT's
samples/common/sampleOptions.cpp by scripts/trtexec_flags.py); every polygraphy line is parsed by
the installed polygraphy's own ``run`` parser; the pinned install line selects a TensorRT the
form runs on. Found here: a ``trt:fp8`` report named TensorRT 8.6 for its weakly typed commands,
but 8.6's ONNX parser imports QuantizeLinear/DequantizeLinear as INT8 only (onnx-tensorrt
release/8.6-GA builtin_op_importers.cpp; FP8 only as its own TRT_FP8QuantizeLinear op): the
printed line fails to parse the model there, and reprokit and repro.py would build on 8.6.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import extract_data, run_cli
from packaging.requirements import Requirement
from test_trt_commands import polygraphy_parses

from reprokit.engine.backends.trt_setup import refuse_unbuildable
from reprokit.engine.backends.trt_versions import BY_KEY, FACTS, Typing, facts_for
from reprokit.errors import EngineUnavailable
from reprokit.report.describe import trtexec_command
from reprokit.report.trtcommands import trt_forms
from reprokit.spec import parse_target
from reprokit.standalone.compare import Criterion

TABLE = json.loads((Path(__file__).parent / "golden" / "trtexec_flags.json").read_text())["lines"]
SAMPLE = Path(__file__).parent.parent / "samples" / "attention_softmax_nan.onnx"
BINS = {"x": "inputs/input_0.bin", "mask": "inputs/input_1.bin"}
TARGETS = [
    "trt",
    "trt:fp16",
    "trt:bf16",
    "trt:int8",
    "trt:fp8",
    "trt:no-tf32,opt-level=3,workspace=512",
    "trt:fp16,fp32-nodes=a/b;c:0",
    "trt:int8,fp32-nodes=n1",
    "trt:strongly-typed,bf16",
    "emulate:fp16",
    "emulate:bf16,fp32-nodes=n/1",
]
ENVS = {  # the fingerprint's TensorRT: none (emulate, CPU), or the version reprokit built with
    "none": {},
    "8.6": {"tensorrt": {"version": "8.6.1", "distribution": "tensorrt"}},
    "10.13": {"tensorrt": {"version": "10.13.3.9", "distribution": "tensorrt-cu12"}},
    "11.1": {"tensorrt": {"version": "11.1.0.7", "distribution": "tensorrt-cu13"}},
    "rtx": {"tensorrt": {"version": "1.7.1.116", "distribution": "tensorrt-rtx-cu13-bindings"}},
}
RELEASES = ["8.6.1", "10.0.1", "10.11.0", "10.13.3", "11.0.0", "11.1.0"]  # the newest last
_VALUES = {"--precisionConstraints": {"none", "prefer", "obey"}}


def trtexec_refusal(line: str, key: str) -> str | None:
    """Why trtexec at the releases of version line ``key`` refuses ``line`` (None: it parses)."""
    argv = shlex.split(line)
    if argv[0] != "trtexec":
        return f"not a trtexec line: {line}"
    for token in argv[1:]:
        name, _, value = token.partition("=")
        for release in TABLE[key]:
            if name not in release["options"]:
                return f"{name} is no option of trtexec {release['tag']}"
        if name in _VALUES and value not in _VALUES[name]:
            return f"{token}: not one of {sorted(_VALUES[name])}"
        if name == "--layerPrecisions":  # NAME:fp32 pairs split on "," then on the last ":"
            pairs = value.split(",")
            if not all(p.rpartition(":")[2] == "fp32" and p.rpartition(":")[0] for p in pairs):
                return f"{token}: a pair is not NAME:fp32"
        if name == "--memPoolSize" and not value.startswith("workspace:"):
            return f"{token}: not a workspace pool"
    return None


def test_the_check_can_fail():
    """The table refuses what the releases lack: BF16 on 8.6, the precision switches on 11."""
    assert "--bf16" in trtexec_refusal("trtexec --onnx=m.onnx --bf16", "8.6")
    assert "--fp16" in trtexec_refusal("trtexec --onnx=m.onnx --fp16", "11")
    assert "--layerPrecisions" in trtexec_refusal("trtexec --layerPrecisions=a:fp32", "11")
    assert trtexec_refusal("trtexec --onnx=m.onnx --precisionConstraints=obeys", "10.12+")
    assert trtexec_refusal("trtexec --onnx=m.onnx --stronglyTyped", "10.12+") is None


@pytest.mark.parametrize("key", [f.key for f in FACTS if f.key != "rtx"])
def test_the_facts_table_has_the_precision_switches_trtexec_has(key):
    """trt_versions.FACTS' trtexec switches are exactly the precision options of trtexec's parser
    on every release of that line (docs/cli.md's table is written from FACTS)."""
    switches = {"--fp16", "--bf16", "--int8", "--fp8", "--best"}
    for release in TABLE[key]:
        present = switches & set(release["options"])
        assert present == set(BY_KEY[key].trtexec_precision), release["tag"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("env", sorted(ENVS))
def test_every_printed_command_runs_on_the_versions_its_form_names(target, env):
    spec = parse_target(target)
    for qdq in (False, True):
        forms = trt_forms(spec, Criterion(), BINS, built_typing=None, qdq=qdq, env=ENVS[env])
        for form in forms:
            assert form.lines, form
            if form.polygraphy is None:  # the form says why it cannot build this report
                assert form.why_not and form.trtexec is None
                continue
            args = polygraphy_parses(form.polygraphy)
            assert bool(args.strongly_typed) == (form.typing is Typing.STRONG)
            for key in form.lines:
                facts = BY_KEY[key]
                assert facts.strongly_typed_flag or form.typing is Typing.WEAK, (key, form.label)
                if key != "rtx" and form.trtexec:  # TensorRT-RTX ships its own tool, not trtexec
                    assert trtexec_refusal(form.trtexec, key) is None, (key, form.trtexec)
            if "8.6" not in form.lines:  # the words name only the versions it runs on
                assert "8.6–" not in form.label, form.label
            _pin_runs_the_form(form)


def _pin_runs_the_form(form):
    """The pip line's tensorrt requirement selects releases of the form's version lines only."""
    req = next(
        Requirement(word.strip("'"))
        for word in shlex.split(form.install)
        if word.strip("'").startswith("tensorrt")
    )
    pinned = [s.version for s in req.specifier if s.operator == "=="]
    chosen = [v for v in RELEASES + pinned if req.specifier.contains(v, prereleases=True)]
    if not req.specifier:  # an unpinned `pip install tensorrt` gets the newest
        chosen = RELEASES[-1:]
    assert chosen and "rtx" not in req.name, form.install  # RTX has its own line in commands.sh
    assert all(facts_for(v).key in form.lines for v in chosen), (form.install, form.lines)


@pytest.mark.parametrize("key", [f.key for f in FACTS if f.key != "rtx"])
def test_the_trtexec_line_of_a_non_tensorrt_archive_runs_everywhere(key):
    for target in ("ort", "ort:opt", "openvino:bf16"):
        assert trtexec_refusal(trtexec_command(parse_target(target), BINS), key) is None


def test_fp8_is_not_claimed_for_tensorrt_8_6():
    """8.6's ONNX parser imports QuantizeLinear as INT8 only: a trt:fp8 report names 10.x, and
    reprokit refuses trt:fp8 on 8.6 (exit 4) before it builds, as for bf16."""
    weak, _ = trt_forms(parse_target("trt:fp8"), Criterion(), {}, built_typing=None, qdq=True)
    assert "8.6" not in weak.lines and "TensorRT 10.x" in weak.label
    assert "FP8" not in facts_for("8.6.1").qdq_types and "FP8" in facts_for("10.0.1").qdq_types
    with pytest.raises(EngineUnavailable, match="FP8") as caught:
        refuse_unbuildable(parse_target("trt:fp8"), facts_for("8.6.1"), has_qdq=True)
    assert caught.value.exit_code == 4
    refuse_unbuildable(parse_target("trt:fp8"), facts_for("10.0.1"), has_qdq=True)
    refuse_unbuildable(parse_target("trt:int8"), facts_for("8.6.1"), has_qdq=True)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa-trtexec")
    done = run_cli("pack", str(SAMPLE), "--target", "emulate:fp16", "-o", "a.tar.gz", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(root / "a.tar.gz") as tar:
        extract_data(tar, root / "x")
    return next(p for p in (root / "x").iterdir() if p.is_dir())


@pytest.mark.parametrize(
    ("version", "target", "words"),
    [("8.6.1", "trt:fp8", "reads no FP8 QuantizeLinear"), ("8.6.1", "trt:int8", None)],
)
def test_repro_py_refuses_fp8_on_8_6_with_4(archive, tmp_path, version, target, words):
    """repro.py decides from the facts it carries, before it builds. A FAKE ``tensorrt`` module
    (only a ``__version__``: the version gate is under test, not TensorRT) stands on PYTHONPATH;
    trt:int8 on 8.6 passes the gate and stops later (the fake cannot build): not 1, not these words."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "tensorrt.py").write_text(f"__version__ = {version!r}\n")
    done = subprocess.run(
        [sys.executable, "repro.py", "--target", target],
        cwd=archive,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(fake)},
    )
    assert done.returncode != 1 and "REPRODUCES" not in done.stdout, done.stdout + done.stderr
    if words:
        assert done.returncode == 4 and words in done.stdout, done.stdout + done.stderr
    else:
        assert "reads no FP8" not in done.stdout


@pytest.mark.parametrize(
    ("target", "model", "tf32_off"),
    [
        ("ort:cuda", "model.onnx", False),
        ("ort:cuda,fp16", "model.fp16.onnx", False),
        ("ort:cuda,bf16,fp32-nodes=n1", "model.bf16.onnx", False),
        ("ort:cuda,no-tf32", "model.onnx", True),
    ],
)
def test_the_ort_cuda_commands_run_what_the_target_ran_and_compare(target, model, tf32_off):
    """An ``ort:cuda`` archive printed `polygraphy run model.onnx --onnxrt --providers cuda`: one
    runner compares nothing, and ``cuda,fp16`` ran the converted ``model.fp16.onnx``, not
    model.onnx (nor did ``no-tf32`` turn TF32 off). Now: the CPU outputs saved, then the target's
    file on CUDA compared with them at the report's tolerances; onnxruntime_perf_test runs the
    same file."""
    from reprokit.engine.oracle import Kind, Signature, Verdict
    from reprokit.report.describe import polygraphy_command
    from reprokit.report.upstream import upstream_values

    spec = parse_target(target)
    criterion = Criterion(atol=0.02, rtol=0.03)
    verdict = Verdict(Signature(Kind.MISMATCH, ("y",), ""), (), criterion, "ort", target, "fp16")
    line = polygraphy_command(spec, verdict, None)
    first, second = line.split(" && ")
    saved = polygraphy_parses(first)
    compared = polygraphy_parses(second)
    assert shlex.split(first)[2] == "model.onnx" and saved.save_outputs_path
    assert shlex.split(second)[2 + tf32_off] == model and compared.providers == ["cuda"]
    assert compared.load_outputs_paths == [saved.save_outputs_path]
    assert (compared.atol, compared.rtol) == (["0.02"], ["0.03"]), (compared.atol, compared.rtol)
    assert second.startswith("NVIDIA_TF32_OVERRIDE=0 ") == tf32_off
    perf = upstream_values(spec, {})["engine_command"]
    assert perf.endswith(f"-I {model}") and perf.startswith("NVIDIA_TF32_OVERRIDE=0 ") == tf32_off
