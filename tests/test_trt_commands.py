"""Issue 36: what an archive prints for TensorRT runs as printed, on either typing, and repro.py's
exit codes mean what they say. Real archives of samples/attention_softmax_nan.onnx (emulate:fp16,
and with fp32-nodes=), every printed polygraphy line parsed by polygraphy's own ``run`` parser,
and repro.py run for real where no TensorRT is installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import extract_data, run_cli

from reprokit.engine.backends.trt_versions import Typing
from reprokit.engine.oracle import Kind, Signature, Verdict
from reprokit.report.reprorun import repro_argv
from reprokit.report.trtcommands import trt_forms
from reprokit.spec import parse_target
from reprokit.standalone.compare import Criterion

SAMPLE = Path(__file__).parent.parent / "samples" / "attention_softmax_nan.onnx"
KEPT = "layer0/self0/attn/softmax"
HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


def polygraphy_parses(line: str):
    """Parse a printed `polygraphy run ...` line with polygraphy's own parser (its Run tool)."""
    from polygraphy.tools.run import Run

    argv = shlex.split(line)
    while argv and "=" in argv[0]:  # an environment assignment (POLYGRAPHY_USE_TENSORRT_RTX=1)
        argv.pop(0)
    assert argv[:2] == ["polygraphy", "run"], line
    tool = Run()
    parser = tool.setup_parser()
    parser.exit_on_error = False
    args = parser.parse_args(argv[2:])
    tool.parse(args)  # the argument groups' own checks (layer precisions, data loader, ...)
    return args


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-commands")
    out = {}
    for key, target in (("plain", "emulate:fp16"), ("kept", f"emulate:fp16,fp32-nodes={KEPT}")):
        proc = run_cli(
            "pack", str(SAMPLE), "--target", target, "-o", f"{key}.tar.gz", cwd=root, timeout=600
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with tarfile.open(root / f"{key}.tar.gz") as tar:
            extract_data(tar, root / key)
        out[key] = root / key / key
    return out


def polygraphy_lines(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if re.match(r"\s*(\S+=\S+ )?polygraphy run ", line)
    ]


@pytest.mark.parametrize("key", ["plain", "kept"])
def test_both_typings_are_printed_with_the_model_each_builds(archives, key):
    folder = archives[key]
    for name in ("commands.sh", "ISSUE.md"):
        text = (folder / name).read_text()
        lines = polygraphy_lines(text)
        strong = [line for line in lines if "--strongly-typed" in line]
        weak = [line for line in lines if "--strongly-typed" not in line]
        assert strong and weak, text
        for line in strong:  # the explicit-precision model, in the archive, with no precision flag
            model = shlex.split(line.split("polygraphy run ", 1)[1])[0]
            assert model == "model.fp16.onnx" and (folder / model).exists()
            assert not re.search(r"--(fp16|bf16|int8|fp8)\b", line), line
        for line in weak:
            assert "--fp16" in line and shlex.split(line)[2] == "model.onnx"
            if key == "kept":
                assert (
                    "--trt-network-postprocess-script repro.py:fp32_layers --precision-constraints obey"
                    in line
                )
        for line in lines:
            polygraphy_parses(line)
    commands = (folder / "commands.sh").read_text()
    if key == "kept":
        # no TensorRT parsed it: a node's later layer names are unknown, so trtexec says why instead
        assert (
            "--layerPrecisions" not in commands
            and "#    trtexec: trtexec pins layers by name" in commands
        )
        assert "--stronglyTyped" in commands and "trtexec --onnx=model.fp16.onnx" in commands
    # the pins it was made with: onnx, onnxruntime, polygraphy
    assert re.search(r"pip install numpy==\S+ onnx==\S+ onnxruntime==\S+", commands)
    assert "polygraphy==" in commands


def test_the_kept_node_stays_float32_in_the_converted_model(archives):
    import onnx

    converted = onnx.load(str(archives["kept"] / "model.fp16.onnx"))
    node = next(n for n in converted.graph.node if n.name == KEPT)
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in onnx.shape_inference.infer_shapes(converted).graph.value_info
    }
    assert types[node.output[0]] == onnx.TensorProto.FLOAT
    issue = (archives["kept"] / "ISSUE.md").read_text()
    assert "`model.fp16.onnx` is `model.onnx` converted to fp16 by reprokit" in issue
    assert f"`{KEPT}`" in issue


def test_a_wrong_command_line_does_not_parse():
    """The parser check can fail: polygraphy refuses an option it does not know."""
    with pytest.raises(SystemExit):
        polygraphy_parses("polygraphy run model.onnx --trt --fp17")


@pytest.mark.parametrize(
    "target",
    [
        "trt:fp16",
        "trt:bf16,no-tf32,opt-level=2,workspace=512",
        "trt:int8",
        "trt:strongly-typed,fp16,fp32-nodes=a;b",
        "emulate:bf16,fp32-nodes=n/1",
    ],
)
def test_every_form_of_every_target_parses(target):
    spec = parse_target(target)
    for qdq in (False, True):
        for form in trt_forms(
            spec, Criterion(), {"x": "inputs/input_0.bin"}, built_typing=None, qdq=qdq
        ):
            if form.polygraphy is None:
                assert (
                    form.typing is Typing.STRONG
                    and "int8" in target
                    and not qdq
                    and "quantize" in form.why_not
                )
                continue
            args = polygraphy_parses(form.polygraphy)
            assert bool(args.strongly_typed) == (form.typing is Typing.STRONG)
            if form.typing is Typing.STRONG:
                assert not (args.fp16 or args.bf16 or args.int8 or args.fp8)


def test_weak_int8_without_qdq_prints_no_uncalibrated_trtexec():
    weak, strong = trt_forms(
        parse_target("trt:int8"), Criterion(), {}, built_typing="weakly-typed", qdq=False
    )
    assert "--int8" in weak.polygraphy and weak.trtexec is None and "calibration" in weak.why_not
    assert strong.polygraphy is None


# -- repro.py's exit codes ----------------------------------------------------------------------


def _repro(folder, *args, env=None):
    return subprocess.run(
        [sys.executable, "repro.py", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here: the engine is not missing")
def test_repro_with_trt_target_and_no_tensorrt_exits_4(archives):
    done = _repro(archives["plain"], "--target", "trt:fp16")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "COULD NOT RUN HERE" in done.stdout and "REPRODUCES" not in done.stdout


def test_repro_strongly_typed_without_the_converted_model_exits_4(archives, tmp_path):
    folder = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(archives["plain"]), str(folder)], check=True)
    (folder / "model.fp16.onnx").unlink()
    for args, env in (
        (["--target", "trt:strongly-typed,fp16"], None),
        (["--target", "trt:fp16"], {"POLYGRAPHY_USE_TENSORRT_RTX": "1"}),
    ):
        done = _repro(folder, *args, env=env)
        assert done.returncode == 4, done.stdout + done.stderr
        assert "model.fp16.onnx is missing" in done.stdout


def test_repro_usage_and_internal_errors_are_never_1(archives, tmp_path):
    folder = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(archives["plain"]), str(folder)], check=True)
    assert _repro(folder, "--target", "nosuchengine").returncode == 64
    assert _repro(folder, "--no-such-option").returncode == 64
    script = folder / "repro.py"
    text = script.read_text()
    script.write_text(
        text.replace("'metric': 'rel-l2'", "'metric': 'no-such-metric'")
    )  # fails inside main
    assert "no-such-metric" in script.read_text()
    broken = _repro(folder)
    assert broken.returncode == 70 and "INTERNAL ERROR" in broken.stdout, (
        broken.stdout + broken.stderr
    )
    script.write_text(
        text.replace("def main():", "def main(:")
    )  # a tampered copy that does not compile
    assert "def main(:" in script.read_text()
    assert (
        _repro(folder).returncode == 1
    )  # Python's own status for it: why reprokit runs repro_argv
    launched = subprocess.run(repro_argv(), cwd=folder, capture_output=True, text=True, timeout=120)
    assert launched.returncode == 70 and "SyntaxError" in launched.stdout, (
        launched.stdout + launched.stderr
    )
    script.write_text(text)
    again = subprocess.run(repro_argv(), cwd=folder, capture_output=True, text=True, timeout=300)
    assert (
        again.returncode == 1 and "REPRODUCES" in again.stdout
    )  # the launcher passes repro.py's own code


def test_strongly_typed_fp16_prints_the_converted_model_without_fp16():
    """Issue 36 item 4: `--fp16` with `--strongly-typed` is refused on 10.x (NVIDIA/TensorRT#4253) and
    the fp32 model.onnx is not what was built."""
    from reprokit.report.describe import polygraphy_command, primary_form

    spec = parse_target("trt:strongly-typed,fp16")
    verdict = Verdict(
        Signature(Kind.NONFINITE, ("y",), "nan"),
        (),
        Criterion(),
        "ort",
        str(spec),
        "fp16",
        target_meta={"mode": "strongly-typed", "built_file": "model.fp16.onnx"},
    )
    forms = trt_forms(spec, Criterion(), {}, built_typing="strongly-typed", qdq=False)
    assert primary_form(forms) is forms[1] and forms[1].built and not forms[0].built
    from models import small_mlp

    printed = polygraphy_command(spec, verdict, small_mlp())
    assert (
        printed.startswith("polygraphy run model.fp16.onnx --trt --strongly-typed")
        and "--fp16" not in printed
    )
    polygraphy_parses(printed)


@pytest.mark.parametrize(
    ("version", "target", "words"),
    [
        ("8.5.3.1", "trt:fp16", "too old"),
        ("8.6.1.6", "trt:bf16", "no BF16 builder flag"),
        ("8.6.1.6", "trt:strongly-typed", "no strongly typed networks"),
        ("11.4.0.9", "trt:int8", "only from Q/DQ nodes"),
    ],
)
def test_repro_refuses_what_the_tensorrt_version_lacks_with_4(
    archives, tmp_path, version, target, words
):
    """repro.py decides from the facts table it carries. A FAKE ``tensorrt`` module (only a
    ``__version__``; the version gate is under test, not TensorRT) stands on PYTHONPATH."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "tensorrt.py").write_text(f"__version__ = {version!r}\n")
    done = _repro(archives["plain"], "--target", target, env={"PYTHONPATH": str(fake)})
    assert done.returncode == 4, done.stdout + done.stderr
    assert words in done.stdout and "REPRODUCES" not in done.stdout
