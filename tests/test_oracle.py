"""The oracle on real engines (onnxruntime reference; fp16/bf16 storage emulator; OpenVINO)
and real models from tests/models.py: agree, non-finite, mismatch, reference failures,
the verdict cache and the tolerance defaults."""

from __future__ import annotations

import numpy as np
import pytest

from reprokit.api import RunOptions, check, make_oracle
from reprokit.engine.bug import same_failure
from reprokit.engine.oracle import Kind, Oracle, Signature, feeds_digest, normalize_message
from reprokit.errors import ExitCode, ReferenceFailure
from reprokit.standalone.compare import Criterion


def test_small_values_agree_under_fp16(model_file):
    result = check(model_file("small_mlp"), "emulate:fp16")
    v = result.verdict
    assert v.signature == Signature(Kind.AGREE)
    assert not v.diverges
    assert v.precision == "fp16" and v.criterion.tolerance == 1e-2
    (out,) = v.outputs
    assert out.name == "y" and 0 < out.rel_l2 < 1e-2  # fp16 storage does round, a little


def test_matmul_output_past_65504_is_nonfinite_inf(model_file):
    v = check(model_file("matmul_overflow"), "emulate:fp16").verdict
    assert v.signature == Signature(Kind.NONFINITE, ("y",), "inf")
    assert v.outputs[0].target_inf == 4 and v.outputs[0].reference_inf == 0
    assert v.outputs[0].max_abs_reference > 65504  # the reference is finite, just big


def test_softmax_of_overflow_is_nonfinite_nan(model_file):
    v = check(model_file("matmul_overflow_softmax"), "emulate:fp16").verdict
    assert v.signature == Signature(Kind.NONFINITE, ("y",), "nan")
    assert v.outputs[0].target_nan == 4


def test_big_bias_then_subtract_is_a_mismatch(model_file):
    result = check(model_file("cancellation"), "emulate:fp16")
    v = result.verdict
    assert v.signature == Signature(Kind.MISMATCH, ("y",))
    # fp16's spacing at 1e4 is 8: every x in [0, 1) comes back as exactly 0
    assert np.all(np.asarray(result.target_outputs["y"]) == 0)
    assert v.outputs[0].rel_l2 == pytest.approx(1.0)
    assert v.outputs[0].target_nan == v.outputs[0].target_inf == 0


def test_tol_override_turns_the_mismatch_into_agreement(model_file):
    path = model_file("cancellation")
    v = check(path, "emulate:fp16", options=RunOptions(tolerance=2.0)).verdict
    assert v.criterion.tolerance == 2.0
    assert v.signature.kind is Kind.AGREE


def test_openvino_bf16_loses_small_weight_steps(model_file, ov_bf16):
    path = model_file("bf16_steps")
    v = check(path, "openvino:bf16").verdict
    assert v.signature == Signature(Kind.MISMATCH, ("y",))
    assert v.precision == "bf16" and v.criterion.tolerance == 5e-2
    assert v.outputs[0].rel_l2 > 0.1
    # OpenVINO confirms it compiled for bf16 (meta holds str(ov.Type): "<Type: 'bfloat16'>")
    assert v.target_meta.get("inference_precision") in ("bf16", "bfloat16")


def test_openvino_f32_agrees_on_the_same_model(model_file):
    pytest.importorskip("openvino", reason="openvino is not installed")
    v = check(model_file("bf16_steps"), "openvino:f32").verdict
    assert v.signature.kind is Kind.AGREE and v.criterion.tolerance == 1e-4


def test_reference_nan_is_a_reference_failure(model_file):
    opts = RunOptions(val_ranges={"x": (-2.0, -1.0)})  # Log of negatives: NaN in the reference
    with pytest.raises(ReferenceFailure) as info:
        check(model_file("log_model"), "emulate:fp16", options=opts)
    assert info.value.exit_code == ExitCode.REFERENCE == 5
    assert info.value.message == "the reference (ort) itself gives 8 NaN/Inf values in output 'y'"
    assert "--val-range" in info.value.hint


def test_same_model_with_positive_inputs_is_fine(model_file):
    opts = RunOptions(val_ranges={None: (1.0, 2.0)})
    assert check(model_file("log_model"), "emulate:fp16", options=opts).verdict.kind is Kind.AGREE


def test_reference_that_cannot_load_the_model_is_a_reference_failure(tmp_path):
    import models
    import onnx
    from onnx import helper

    # x[1,8] -> NoSuchOp -> y[1,8]  (no engine implements it)
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [models.vi("x", [1, 8])],
        [models.vi("y", [1, 8])],
    )
    path = str(tmp_path / "badop.onnx")
    onnx.save(
        helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), path
    )
    with pytest.raises(ReferenceFailure) as info:
        check(path, "emulate:fp16")
    assert info.value.exit_code == 5
    assert info.value.message.startswith("the reference (ort) fails on this model: build-error:")
    assert "NoSuchOp" in info.value.message


def test_verdict_cache_runs_the_target_once(model_file, tmp_path):
    path = model_file("cancellation")
    oracle = Oracle(
        "ort",
        "emulate:fp16",
        Criterion.for_precision("fp16"),
        precision="fp16",
        workdir=str(tmp_path / "calls"),
    )
    feeds = {"x": np.random.default_rng(0).uniform(size=(1, 16)).astype(np.float32)}
    first = oracle.judge(path, feeds)
    second = oracle.judge(path, dict(feeds))
    assert not first.cached and second.cached
    assert first.signature == second.signature == Signature(Kind.MISMATCH, ("y",))
    assert first.outputs == second.outputs
    assert (oracle.stats.cached, oracle.stats.target, oracle.stats.reference) == (1, 1, 1)
    # other feeds are another question: not served from the cache
    oracle.judge(path, {"x": feeds["x"] + 1})
    assert (oracle.stats.cached, oracle.stats.target) == (1, 2)


def test_two_nonfinite_outputs_give_nan_plus_inf(model_file, tmp_path):
    """Both the overflowing MatMul (inf) and the Softmax after it (nan) as graph outputs."""
    import onnx

    from reprokit.graph.model import mark_outputs

    model = mark_outputs(onnx.load(model_file("matmul_overflow_softmax")), ["h"])
    path = str(tmp_path / "both.onnx")
    onnx.save(model, path)
    v = check(path, "emulate:fp16").verdict
    assert v.signature.kind is Kind.NONFINITE and v.signature.detail == "nan+inf"
    assert set(v.signature.outputs) == {"h", "y"}


@pytest.mark.parametrize(
    "target, precision, tol",
    [
        ("emulate:fp16", "fp16", 1e-2),
        ("emulate:bf16", "bf16", 5e-2),
        ("openvino:bf16", "bf16", 5e-2),
        ("openvino", "bf16", 5e-2),  # bf16 is OpenVINO's default hint
        ("openvino:f32", "fp32", 1e-4),
        ("ort", "fp32", 1e-4),
        ("ort:opt", "fp32", 1e-4),
    ],
)
def test_tolerance_defaults_by_target_precision(tmp_path, target, precision, tol):
    oracle = make_oracle(target, RunOptions(), str(tmp_path))
    assert oracle.precision == precision
    assert oracle.criterion.tolerance == tol


def test_tol_atol_rtol_and_metric_options_reach_the_criterion(tmp_path):
    opts = RunOptions(metric="allclose", tolerance=0.5, atol=0.25, rtol=0.125)
    crit = make_oracle("emulate:fp16", opts, str(tmp_path)).criterion
    assert (crit.metric.value, crit.tolerance, crit.atol, crit.rtol) == (
        "allclose",
        0.5,
        0.25,
        0.125,
    )


def test_signature_same_bug_rules():
    crash = Signature(Kind.CRASH, detail="SIGSEGV")
    assert same_failure(crash, Signature(Kind.CRASH, detail="SIGSEGV"))
    assert not same_failure(crash, Signature(Kind.CRASH, detail="SIGABRT"))
    # numeric kinds ignore output names: a cut subgraph names its outputs differently
    assert same_failure(Signature(Kind.NONFINITE, ("y",), "inf"),
        Signature(Kind.NONFINITE, ("h",), "nan")
    )
    assert not same_failure(Signature(Kind.MISMATCH, ("y",)), Signature(Kind.NONFINITE, ("y",), "inf"))
    assert Signature(Kind.NONFINITE, ("a", "b"), "inf").describe() == "nonfinite (inf) in a, b"


def test_normalize_message_masks_paths_names_and_numbers():
    text = "loading /tmp/x/model.onnx\nError: node 'conv_12' failed at 0x7ffe12 with code 42\n"
    assert normalize_message(text) == "Error: node <name> failed at N with code N"
    assert normalize_message("") == ""


def test_normalize_message_keeps_quoted_operator_types():
    """'unsupported op A' and 'unsupported op B' are two bugs: quoted op types are not masked."""
    unique = normalize_message("Error: unsupported op 'Unique' in node 'u_1'")
    nonzero = normalize_message("Error: unsupported op 'NonZero' in node 'u_1'")
    assert unique == "Error: unsupported op 'Unique' in node <name>"
    assert unique != nonzero


def test_crashes_without_a_signal_are_told_apart_by_exit_code_and_last_words(tmp_path):
    """An engine process that exits without a result (no signal) is a crash whose signature
    carries its exit code and last words, so two different aborts are two findings."""
    from reprokit.engine.oracle import Oracle
    from reprokit.engine.worker import WorkerResult
    from reprokit.standalone.compare import Criterion

    oracle = Oracle("ort", "emulate:fp16", Criterion.for_precision("fp16", "rel-l2", None, None, None),
                    precision="fp16", workdir=str(tmp_path))
    message = "engine process exited with code {} without a result"
    first = oracle.verdict_from(WorkerResult("crash", message=message.format(3), log="CUDA error: illegal address"), {})
    other = oracle.verdict_from(WorkerResult("crash", message=message.format(3), log="std::bad_alloc thrown"), {})
    code = oracle.verdict_from(WorkerResult("crash", message=message.format(5), log="CUDA error: illegal address"), {})
    assert first.kind is Kind.CRASH and "exit code 3" in first.signature.detail
    assert not same_failure(first.signature, other.signature)
    assert not same_failure(first.signature, code.signature)
    assert same_failure(first.signature, oracle.verdict_from(
        WorkerResult("crash", message=message.format(3), log="CUDA error: illegal address"), {}).signature)


def test_two_threads_asking_the_same_verdict_build_the_engine_once(model_file, tmp_path):
    """The verdict cache is checked and filled under one lock: --jobs never builds twice."""
    import threading

    from reprokit.api import RunOptions, make_oracle

    oracle = make_oracle("emulate:fp16", RunOptions(), str(tmp_path / "calls"))
    path = model_file("small_mlp")
    import onnx

    feeds = {i.name: np.random.default_rng(0).random([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in onnx.load(path).graph.input}
    verdicts = []
    threads = [threading.Thread(target=lambda: verdicts.append(oracle.judge(path, feeds))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert oracle.stats.target == 1 and oracle.stats.reference == 1
    assert len({v.signature for v in verdicts}) == 1 and sum(v.cached for v in verdicts) == 2


def test_feeds_digest_reads_every_feed_by_value():
    """The verdict cache key and --resume's fingerprint: ml_dtypes arrays (int4 once stopped
    shrink with exit 70), strings by content (not by object address), ragged sequences, None."""
    import ml_dtypes

    def feeds():
        return {"b": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
                "i": np.zeros(0, ml_dtypes.int4), "s": np.array(["ab", "c" * 3], dtype=object),
                "q": [np.zeros(2, np.float32), np.ones(3, np.float32)], "o": None}

    assert feeds_digest(feeds()) == feeds_digest(feeds())
    for name, other in [("s", np.array(["ab", "ccd"], dtype=object)), ("q", [np.zeros(2, np.float32)]),
                        ("b", np.arange(6, dtype=np.uint16).reshape(2, 3)), ("o", np.zeros(0, np.float32))]:
        assert feeds_digest({**feeds(), name: other}) != feeds_digest(feeds()), name
