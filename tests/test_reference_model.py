"""Issue 36, the TensorRT 11 user's own workflow: the model is already fp16 (ModelOpt AutoCast,
onnxconverter-common), the fp32 original is the reference (``--reference-model``), the target
runs the converted model as written (``emulate:typed`` on the CPU), the minimal repro holds both
models' cuts, and the AutoCast exclusion that fixes it is tested by converting again.

onnxruntime's CPU provider computes most fp16 ops of such a model in fp32 (it inserts Casts and
removes the fp32→fp16→fp32 pairs), so plain ``ort`` shows no overflow on the whole converted
sample: ``emulate:typed`` stores exactly the tensors the file declares fp16 and is the CPU
stand-in for a strongly typed TensorRT engine here."""

from __future__ import annotations

import json
import re
import shlex
import tarfile

import numpy as np
import onnx
import pytest
from conftest import REPO, assert_user_error, extract_data, run_cli
from models import cancellation, const, make, save, vi
from onnx import TensorProto, helper

from reprokit.convert import convert_float_model
from reprokit.convert.twin import Twins, map_cut
from reprokit.shrink.exclusion import autocast_command

float16 = pytest.importorskip("onnxconverter_common.float16", reason="the test extra's onnxconverter-common")

SAMPLE = str(REPO / "samples" / "attention_softmax_nan.onnx")
SAMPLE_INPUTS = str(REPO / "samples" / "attention_softmax_nan.inputs.npz")
QK = "layer2/self0/attn/qk_matmul"


def overflow_chain() -> onnx.ModelProto:
    """A benign head and tail around a MatMul whose output passes fp16's 65504 into a Softmax."""
    # x[1,16] -> Relu -> r -> MatMul(W = 3e4) -> h (inf in fp16) -> Softmax -> s (nan) -> Mul(2) -> y[1,4]
    return make(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "W"], ["h"], name="matmul"),
         helper.make_node("Softmax", ["h"], ["s"], name="softmax", axis=-1),
         helper.make_node("Mul", ["s", "two"], ["y"], name="scale")],
        [vi("x", [1, 16])],
        [vi("y", [1, 4])],
        [const("W", np.full((16, 4), 3e4)), const("two", np.float32(2.0))],
    )


def occ(model, block=()) -> onnx.ModelProto:
    """onnxconverter-common's fp16 conversion, float32 I/O kept: AutoCast's output, stood in for."""
    return float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=list(block))


def test_converted_by_onnxconverter_common_shrinks_to_the_overflow_and_its_exclusion_fixes_it(tmp_path):
    """The done-when: a sample converted outside reprokit, --reference-model its fp32 original,
    shrinks to the MatMul that overflows; the printed AutoCast exclusion, applied by converting
    again (onnxconverter-common's node_block_list standing in for --nodes_to_exclude), agrees."""
    converted = save(occ(onnx.load(SAMPLE)), tmp_path / "model.fp16.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", converted, "--reference-model", SAMPLE, "--target", "emulate:typed",
                   "--inputs", SAMPLE_INPUTS, "-o", str(out), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["minimal"]["node_names"] == [QK]
    exclusion = summary["exclusion"]
    assert exclusion["tested"] is True and QK in exclusion["nodes"]
    assert f"--nodes_to_exclude '^{QK}$'" in proc.stdout
    assert "python -m modelopt.onnx.autocast --onnx_path" in proc.stdout
    # the exclusion, applied by another converter than the one that tested it, fixes the model
    fixed = save(occ(onnx.load(SAMPLE), exclusion["nodes"]), tmp_path / "fixed.onnx")
    again = run_cli("check", fixed, "--reference-model", SAMPLE, "--target", "emulate:typed",
                    "--inputs", SAMPLE_INPUTS, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    # both cuts are in the archive, and the archive reproduces on its own
    with tarfile.open(out / "report.tar.gz") as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
        issue = archive.extractfile("report/ISSUE.md").read().decode()
    assert {"model.onnx", "model.target.onnx"} <= names
    assert "model.target.onnx" in issue and "--nodes_to_exclude" in issue
    assert summary["report_reproduces"] is True
    verify = run_cli("verify", str(out / "report.tar.gz"), cwd=tmp_path)
    assert verify.returncode == 1, verify.stdout + verify.stderr


def test_reprokit_converted_chain_shrinks_to_the_matmul_and_the_exclusion_takes_its_reader(tmp_path):
    """reprokit's own converter as the user's: the MatMul alone kept in fp32 still hands an
    overflowing fp16 copy to the Softmax, so the tested exclusion is the MatMul and its reader."""
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(convert_float_model(overflow_chain(), "fp16"), tmp_path / "fp16.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", converted, "--reference-model", fp32, "--target", "emulate:typed", "--no-pack",
                   "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["minimal"]["node_names"] == ["matmul"]
    assert summary["exclusion"]["nodes"] == ["matmul", "softmax"] and summary["exclusion"]["tested"] is True
    assert [r["verdict"] for r in summary["exclusion"]["rounds"]][-1] == "agree"
    fixed = save(convert_float_model(overflow_chain(), "fp16", {"matmul", "softmax"}), tmp_path / "fixed.onnx")
    assert run_cli("check", fixed, "--reference-model", fp32, "--target", "emulate:typed", cwd=tmp_path).returncode == 0


def test_emulate_typed_rounds_only_what_the_file_declares_fp16(tmp_path):
    """emulate:typed on a converted model: all fp16, the overflow shows (NaN); with the MatMul and
    Softmax blocked (float32 in the file), the same engine agrees with onnxruntime."""
    whole = save(occ(overflow_chain()), tmp_path / "whole.onnx")
    mixed = save(occ(overflow_chain(), ["matmul", "softmax"]), tmp_path / "mixed.onnx")
    diverges = run_cli("check", whole, "--target", "emulate:typed", cwd=tmp_path)
    assert diverges.returncode == 1 and "nonfinite" in diverges.stdout, diverges.stdout + diverges.stderr
    agrees = run_cli("check", mixed, "--target", "emulate:typed", cwd=tmp_path)
    assert agrees.returncode == 0, agrees.stdout + agrees.stderr


@pytest.mark.parametrize("target", ["emulate:fp16", "trt:fp16", "trt:int8", "openvino:bf16", "ort:cuda,fp16",
                                    "openvino"])
def test_targets_that_would_change_the_models_precision_are_refused(tmp_path, target):
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(occ(overflow_chain()), tmp_path / "fp16.onnx")
    proc = run_cli("check", converted, "--reference-model", fp32, "--target", target, cwd=tmp_path)
    assert_user_error(proc, 2, contains="changes its precision", hint_contains="--target")


def test_a_model_that_is_not_a_conversion_is_refused(tmp_path):
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    proc = run_cli("check", fp32, "--reference-model", fp32, "--target", "emulate:typed", cwd=tmp_path)
    assert_user_error(proc, 3, contains="holds no fp16/bf16 tensor")
    other = make([helper.make_node("Add", ["a", "a"], ["b"], name="other_add")], [vi("a", [1, 4])], [vi("b", [1, 4])])
    stranger = save(convert_float_model(other, "fp16"), tmp_path / "other.fp16.onnx")
    proc = run_cli("shrink", stranger, "--reference-model", fp32, "--target", "emulate:typed", "-o",
                   str(tmp_path / "out"), cwd=tmp_path)
    assert_user_error(proc, 3, contains="is not a conversion")
    proc = run_cli("audit", stranger, "--reference-model", fp32, "--target", "emulate:typed", "-o",
                   str(tmp_path / "audit"), cwd=tmp_path)
    assert_user_error(proc, 2, contains="--reference-model")


def test_a_packed_members_cut_maps_onto_the_converted_twin(tmp_path):
    """A cut as a pack names it (``rk3/`` prefixes): the Softmax maps to its fp16 twin, its cut
    input is fed the fp32 activation through a Cast to fp16, and onnxruntime runs the result
    (an fp16 output, the twin's type)."""
    twins = Twins.build(overflow_chain(), occ(overflow_chain()))
    # rk3/h[1,4] -> Softmax (named rk3/softmax) -> rk3/s
    cut = helper.make_model(helper.make_graph(
        [helper.make_node("Softmax", ["rk3/h"], ["rk3/s"], name="rk3/softmax", axis=-1)], "cut",
        [helper.make_tensor_value_info("rk3/h", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("rk3/s", TensorProto.FLOAT, [1, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    mapped = map_cut(twins, cut)
    onnx.checker.check_model(mapped)
    ops = [(n.op_type, [a.i for a in n.attribute if a.name == "to"]) for n in mapped.graph.node]
    assert ops == [("Cast", [TensorProto.FLOAT16]), ("Softmax", [])]
    assert mapped.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    import onnxruntime as ort

    session = ort.InferenceSession(mapped.SerializeToString(), providers=["CPUExecutionProvider"])
    h = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    (out,) = session.run(None, {"rk3/h": h})
    expected = np.exp(h - h.max()) / np.exp(h - h.max()).sum()
    assert out.dtype == np.float16 and np.allclose(out.astype(np.float32), expected, atol=1e-3)


def test_autocast_patterns_select_exactly_their_nodes():
    """--nodes_to_exclude takes regular expressions: names are escaped and anchored."""
    names = ["blk.0/attn[1]", "blk.0/attn", "blkx0/attn"]
    command = autocast_command("m.onnx", "fp16", names[:1], keep_io_types=True)
    pattern = re.search(r"--nodes_to_exclude '([^']+)'", command).group(1)
    assert [n for n in names if re.match(pattern, n)] == ["blk.0/attn[1]"]
    assert "--low_precision_type fp16 --keep_io_types" in command


def test_layerwise_judges_each_node_alone_on_the_converted_twin(tmp_path):
    """--layerwise's "on its own" run is a target call too: it runs the converted cuts, so the
    MatMul is where the divergence starts (not "accumulated", as fp32 cuts under emulate:typed say)."""
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(occ(overflow_chain()), tmp_path / "fp16.onnx")
    proc = run_cli("check", converted, "--reference-model", fp32, "--target", "emulate:typed", "--layerwise",
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "divergence starts at matmul: it diverges on its own" in proc.stdout


def test_resume_continues_with_both_models(tmp_path):
    """run.json keeps MODEL (the converted one) and --reference-model: --resume DIR alone judges
    the same pair (found broken: the resumed run judged the fp32 model alone and found no bug)."""
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(occ(overflow_chain()), tmp_path / "fp16.onnx")
    out = tmp_path / "out"
    first = run_cli("shrink", converted, "--reference-model", fp32, "--target", "emulate:typed", "--no-pack",
                    "--max-calls", "2", "-o", str(out), cwd=tmp_path)
    assert first.returncode == 8, first.stdout + first.stderr  # stopped at its budget, nothing removed
    again = run_cli("shrink", "--resume", str(out), "--max-calls", "0", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == converted and summary["minimal"]["node_names"] == ["matmul"]
    assert f"--reference-model {fp32}" in summary["rerun"]


def test_a_cut_runs_the_converted_models_own_weights(tmp_path):
    """onnxconverter-common clamps weights to ±10000: the target's cut holds the converted
    weight as the user's model has it (fp16 1e4), not the fp32 cut's 3e4 cast anew."""
    twins = Twins.build(overflow_chain(), occ(overflow_chain()))
    # rk1/r[1,16] -> MatMul(rk1/W = 3e4) (named rk1/matmul) -> rk1/h[1,4]
    cut = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["rk1/r", "rk1/W"], ["rk1/h"], name="rk1/matmul")], "cut",
        [helper.make_tensor_value_info("rk1/r", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("rk1/h", TensorProto.FLOAT, [1, 4])],
        [const("rk1/W", np.full((16, 4), 3e4))]), opset_imports=[helper.make_opsetid("", 17)])
    (weight,) = map_cut(twins, cut).graph.initializer
    assert weight.data_type == TensorProto.FLOAT16
    assert np.all(onnx.numpy_helper.to_array(weight) == np.float16(1e4))


def _polygraphy_parser():
    import argparse

    run_tool = pytest.importorskip("polygraphy.tools.run", reason="the test extra's polygraphy").Run()
    parser = argparse.ArgumentParser(exit_on_error=False)
    run_tool.setup_parser(parser.add_subparsers())
    return parser


def test_pack_prints_strongly_typed_commands_on_the_converted_cut_that_polygraphy_parses(tmp_path):
    """commands.sh of a --reference-model archive: polygraphy saves the fp32 cut's onnxruntime
    outputs, then builds model.target.onnx strongly typed and compares against them; trtexec
    builds model.target.onnx with --stronglyTyped. Each polygraphy line passes polygraphy's own
    parser, and the first one runs here."""
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(occ(overflow_chain()), tmp_path / "fp16.onnx")
    proc = run_cli("pack", converted, "--reference-model", fp32, "--target", "emulate:typed", "-o",
                   str(tmp_path / "r.tar.gz"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(tmp_path / "r.tar.gz") as archive:
        extract_data(archive, tmp_path / "x")
    folder = tmp_path / "x" / "r"
    lines = (folder / "commands.sh").read_text().splitlines()
    polygraphy = next(line for line in lines if line.startswith("polygraphy run"))
    trtexec = next(line for line in lines if line.startswith("trtexec"))
    save_run, trt_run = polygraphy.split(" && ")
    assert "model.onnx --onnxrt" in save_run and "--save-outputs reference_outputs.json" in save_run
    assert "model.target.onnx --trt --strongly-typed" in trt_run and "--load-outputs reference_outputs.json" in trt_run
    assert "--fp16" not in polygraphy and "--onnx=model.target.onnx --stronglyTyped" in trtexec
    parser = _polygraphy_parser()
    for command in (save_run, trt_run):
        parser.parse_args(shlex.split(command)[1:])
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(sys.executable).parent / "polygraphy"
    done = subprocess.run([str(tool), *shlex.split(save_run)[1:]], cwd=folder, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and (folder / "reference_outputs.json").exists(), done.stdout + done.stderr


def test_a_converted_model_with_fp16_inputs_is_fed_the_fp32_feeds_cast(tmp_path):
    """Converted without keep_io_types (fp16 graph inputs): the target runs the mapped model,
    whose Casts take the fp32 model's feeds (the file itself would refuse float32 feeds)."""
    fp32 = save(overflow_chain(), tmp_path / "fp32.onnx")
    converted = save(float16.convert_float_to_float16(overflow_chain(), keep_io_types=False), tmp_path / "fp16.onnx")
    proc = run_cli("check", converted, "--reference-model", fp32, "--target", "emulate:typed", cwd=tmp_path)
    assert proc.returncode == 1 and "nonfinite" in proc.stdout, proc.stdout + proc.stderr


def test_a_bf16_conversion_is_judged_in_bf16(tmp_path):
    """A model converted to bf16 (reprokit's converter): emulate:typed rounds its bf16 tensors
    and the tolerance is bf16's; x + 1e4 - 1e4 loses x (bf16 spacing at 1e4 is 64)."""
    fp32 = save(cancellation(), tmp_path / "fp32.onnx")
    converted = save(convert_float_model(cancellation(), "bf16"), tmp_path / "bf16.onnx")
    proc = run_cli("check", converted, "--reference-model", fp32, "--target", "emulate:typed", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["precision"] == "bf16" and verdict["signature"]["kind"] == "mismatch"
