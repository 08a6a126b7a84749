"""compare.py's float32 path for pack members (``full=False``): the verdict of every tensor of
real models under the real fp16 emulator equals the float64 computation's, at ties too, and it
makes no float64 copy of the arrays (issue 39: comparing a Swin survey pack's outputs)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from reprokit.engine.layerwise import float_node_outputs
from reprokit.graph.model import mark_outputs
from reprokit.standalone.compare import Criterion, Metric, compare_arrays
from reprokit.standalone.emulation import emulate_model
from reprokit.standalone.values import unrepresentable

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def every_tensor(sample: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, onnxruntime's value, the fp16 emulator's value) of every float tensor of a bundled
    sample run on its own inputs, both engines in this process."""
    model = onnx.load(str(SAMPLES / f"{sample}.onnx"))
    names = [tensor for tensor, *_ in float_node_outputs(model)]
    marked = mark_outputs(model, names)
    with np.load(SAMPLES / f"{sample}.inputs.npz") as data:
        feeds = {k: data[k] for k in data.files}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    def run(proto) -> dict:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))

    reference, target = run(marked), run(emulate_model(marked, "fp16"))
    return [(n, reference[n], target[n]) for n in names if reference[n].dtype == np.float32]


def float64_way(name: str, reference, target, criterion: Criterion):
    """The comparison as it was before the float32 path: the arrays as float64 (exact copies)."""
    return compare_arrays(
        name, reference.astype(np.float64), target.astype(np.float64), criterion, full=False
    )


@pytest.mark.parametrize(
    "sample", ["conv_clip", "layernorm_overflow", "attention_softmax_nan", "log_div_underflow"]
)
def test_member_verdicts_equal_the_float64_ones_on_every_tensor_of_real_models(sample):
    tensors = every_tensor(sample)
    assert len(tensors) >= 5
    for name, reference, target in tensors:
        for metric in (Metric.REL_L2, Metric.MAX_ABS):
            exact = float64_way(name, reference, target, Criterion(metric=metric, tolerance=1.0))
            # the default bounds, and bounds AT the error itself and one float32 rounding beside it
            # (the ties the margin re-judges the float64 way)
            bounds = [1e-2, 1e-3]
            if np.isfinite(exact.error) and exact.error > 0:
                bounds += [exact.error, exact.error * (1 + 1e-6), exact.error * (1 - 1e-6)]
            for bound in bounds:
                criterion = Criterion(metric=metric, tolerance=bound)
                want = float64_way(name, reference, target, criterion)
                got = compare_arrays(name, reference, target, criterion, full=False)
                assert got.exceeds == want.exceeds, (sample, name, metric, bound)
                assert got.nonfinite_in_target_only == want.nonfinite_in_target_only
                assert (got.target_nan, got.target_inf) == (want.target_nan, want.target_inf)
                if np.isfinite(want.error):
                    assert got.error == pytest.approx(want.error, rel=1e-5, abs=1e-12)
                    assert got.max_abs_reference == want.max_abs_reference
                else:
                    assert not np.isfinite(got.error)


def test_an_error_at_the_bound_is_judged_the_float64_way():
    """rel-l2 at the bound or within compare.FLOAT32_MARGIN (1e-4) of it: the float64 numbers, to
    the last bit."""
    rng = np.random.default_rng(5)
    reference = rng.standard_normal(10_000).astype(np.float32)
    target = (reference + rng.standard_normal(10_000).astype(np.float32) * 1e-3).astype(np.float32)
    exact = float64_way("y", reference, target, Criterion(tolerance=1.0)).rel_l2
    for bound in (exact, exact * (1 + 5e-5), exact * (1 - 5e-5)):
        got = compare_arrays("y", reference, target, Criterion(tolerance=bound), full=False)
        want = float64_way("y", reference, target, Criterion(tolerance=bound))
        assert (got.rel_l2, got.exceeds) == (want.rel_l2, want.exceeds)


def test_a_member_comparison_makes_no_float64_copies():
    """A survey pack of a Swin has ~1,600 members of ~300k floats: copying each pair to float64
    (16 bytes an element) was most of its comparing. Now: one float32 difference and its abs."""
    rng = np.random.default_rng(1)
    reference = rng.standard_normal(1_000_000).astype(np.float32)
    target = (reference * 1.001).astype(np.float32)
    criterion = Criterion(tolerance=1e-2)
    tracemalloc.start()
    try:
        error = compare_arrays("y", reference, target, criterion, full=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not error.exceeds and error.rel_l2 == pytest.approx(1e-3, rel=1e-3)
    assert peak < 10 * reference.size, f"{peak / reference.size:.1f} bytes per element"


def flushed_or_overflowing(values: np.ndarray, precision: str) -> str | None:
    """unrepresentable as it was written first (the finite values copied, then the non-zero
    ones): the specification the one-pass version must match word for word."""
    high, tiny = {
        "fp16": (65504.0, 2.9802322e-08),
        "bf16": (3.3895314e38, 4.6e-41),
        "fp8": (448.0, 9.8e-4),
    }[precision]
    magnitude = np.abs(values[np.isfinite(values)])
    over = int(np.count_nonzero(magnitude > high))
    if over:
        return f"{over} values beyond the {precision} maximum {high:g}"
    nonzero = magnitude[magnitude > 0]
    under = int(np.count_nonzero(nonzero < tiny))
    if nonzero.size and under >= 0.01 * nonzero.size:
        return f"{under} of {nonzero.size} non-zero values flush to zero in {precision}"
    return None


def test_cut_tensors_are_judged_as_before_without_copying_them():
    """The cut tensors of every candidate are checked for fp16 overflow / mass underflow: the
    same words as before on real activations and edge cases, with a quarter of the memory."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    activations = [reference for _, reference, _ in every_tensor("layernorm_overflow")]
    edges = [
        np.where(rng.random(n) < 0.5, 0, rng.standard_normal(n) * 1e-8),  # mass underflow
        np.where(rng.random(n) < 0.02, 7e4, rng.standard_normal(n)),  # fp16 overflow
        np.where(rng.random(n) < 0.011, 1e-8, 1.0),  # just past the 1% underflow share
        np.where(rng.random(n) < 0.009, 1e-8, 1.0),  # just under it
        np.array([np.nan, np.inf, 1e-9, 0, 1]),
        np.array([np.nan, np.nan]),
        np.array([-np.inf, 1e5]),
        np.zeros(10),
    ]
    for values in activations + [e.astype(np.float32) for e in edges]:
        for precision in ("fp16", "bf16", "fp8"):
            assert unrepresentable(values, precision) == flushed_or_overflowing(values, precision)
    values = rng.standard_normal(n).astype(np.float32)
    tracemalloc.start()
    try:
        assert unrepresentable(values, "fp16") is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * n, f"{peak / n:.1f} bytes per element"


def test_kept_reference_sums_give_the_same_numbers():
    """A captured activation's sums, kept by the oracle across a run's packs
    (``Oracle._sums_of``), give the very numbers computing them again gives."""
    from reprokit.standalone.compare import reference_sums

    for name, reference, target in every_tensor("conv_clip"):
        criterion = Criterion(tolerance=1e-3)
        kept = compare_arrays(
            name, reference, target, criterion, full=False, reference_sums=reference_sums(reference)
        )
        again = compare_arrays(name, reference, target, criterion, full=False)
        assert kept == again or (np.isnan(kept.cosine_distance) and repr(kept) == repr(again))
