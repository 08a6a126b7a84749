"""compare.py: metrics on arrays whose errors are known by hand, and the tolerance defaults."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reprokit.standalone.compare import DEFAULT_TOLERANCE, Criterion, Metric, compare_arrays

INF, NAN = np.inf, np.nan


def f32(*values):
    return np.array(values, dtype=np.float32)


def test_rel_l2_max_abs_and_cosine_on_known_arrays():
    # ref (3, 4) has norm 5; target differs by 0.5 in one place: rel L2 = 0.5/5 = 0.1
    e = compare_arrays("y", f32(3, 4), f32(3, 4.5), Criterion(tolerance=0.2))
    assert e.rel_l2 == pytest.approx(0.1)
    assert e.max_abs == pytest.approx(0.5)
    assert e.max_abs_reference == 4.0
    # cos = (9 + 18) / (5 * sqrt(29.25))
    assert e.cosine_distance == pytest.approx(1 - 27 / (5 * math.sqrt(29.25)))
    assert e.error == e.rel_l2 and not e.exceeds
    assert compare_arrays("y", f32(3, 4), f32(3, 4.5), Criterion(tolerance=0.05)).exceeds


def test_identical_arrays_have_zero_error():
    a = np.linspace(-2, 2, 17, dtype=np.float32)
    e = compare_arrays("y", a, a.copy(), Criterion(tolerance=0.0))
    assert (e.rel_l2, e.max_abs, e.cosine_distance, e.mismatched) == (0.0, 0.0, 0.0, 0)
    assert not e.exceeds  # error 0 <= tolerance 0


def test_orthogonal_vectors_have_cosine_distance_one():
    e = compare_arrays("y", f32(1, 0), f32(0, 1), Criterion(metric=Metric.COSINE, tolerance=0.5))
    assert e.cosine_distance == pytest.approx(1.0)
    assert e.error == e.cosine_distance and e.exceeds


def test_max_abs_metric_uses_its_own_bound():
    crit = Criterion(metric=Metric.MAX_ABS, tolerance=0.25)
    assert not compare_arrays("y", f32(1, 2), f32(1.2, 2), crit).exceeds
    e = compare_arrays("y", f32(1, 2), f32(1.3, 2), crit)
    assert e.error == pytest.approx(0.3, rel=1e-6) and e.exceeds


def test_allclose_counts_mismatched_elements():
    # |t - r| <= atol + rtol*|r| with atol = rtol = 0.01: 1.001 vs 1 passes, 2.5 vs 2 and 3.1 vs 3 fail
    crit = Criterion(metric=Metric.ALLCLOSE, atol=0.01, rtol=0.01)
    e = compare_arrays("y", f32(0, 1, 2, 3), f32(0, 1.001, 2.5, 3.1), crit)
    assert e.mismatched == 2
    assert e.error == 2.0 and e.exceeds
    assert not compare_arrays("y", f32(0, 1, 2, 3), f32(0, 1.001, 2, 3), crit).exceeds


def test_nan_in_target_only_is_flagged():
    e = compare_arrays("y", f32(1, 2, 3), f32(1, NAN, 3), Criterion())
    assert (e.target_nan, e.target_inf, e.reference_nan) == (1, 0, 0)
    assert e.nonfinite_in_target_only
    assert e.exceeds and e.rel_l2 == INF and e.max_abs == INF


def test_inf_in_target_only_is_flagged():
    e = compare_arrays("y", f32(1, 2, 3), f32(1, 2, INF), Criterion())
    assert (e.target_nan, e.target_inf) == (0, 1)
    assert e.nonfinite_in_target_only and e.exceeds


def test_same_nan_and_inf_in_both_is_not_a_divergence():
    ref = f32(1, NAN, INF, -INF, 2)
    e = compare_arrays("y", ref, ref.copy(), Criterion(tolerance=1e-6))
    assert not e.nonfinite_in_target_only
    assert e.rel_l2 == 0.0 and e.max_abs == 0.0 and e.mismatched == 0
    assert not e.exceeds


def test_opposite_infinities_are_a_divergence():
    e = compare_arrays("y", f32(1, INF), f32(1, -INF), Criterion())
    assert e.exceeds and e.rel_l2 == INF
    assert not e.nonfinite_in_target_only  # same count of infs on both sides


def test_same_nonfinite_is_not_a_divergence_under_cosine():
    ref = f32(1, 2, -INF)
    e = compare_arrays("y", ref, ref.copy(), Criterion(metric=Metric.COSINE, tolerance=1e-3))
    assert not e.exceeds


def test_shape_mismatch_is_an_infinite_error():
    e = compare_arrays("y", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), Criterion())
    assert e.shape == (2, 3)
    assert e.rel_l2 == INF and e.max_abs == INF and e.error == INF
    assert e.mismatched == 6 and e.exceeds


def test_zero_reference():
    crit = Criterion(tolerance=1e-3)
    assert not compare_arrays("y", f32(0, 0), f32(0, 0), crit).exceeds
    e = compare_arrays("y", f32(0, 0), f32(0, 1e-3), crit)
    assert e.rel_l2 == INF and e.exceeds


def test_integer_outputs_are_compared_as_numbers():
    ref = np.array([1, 2, 3], dtype=np.int64)
    assert not compare_arrays("i", ref, ref.copy(), Criterion(tolerance=0)).exceeds
    e = compare_arrays("i", ref, np.array([1, 2, 4], dtype=np.int64), Criterion(tolerance=0.1))
    assert e.max_abs == 1.0 and e.exceeds
    assert (e.target_nan, e.target_inf) == (0, 0)


def test_to_json_is_strict_json_with_readable_infinities():
    e = compare_arrays("y", f32(1, 2), f32(1, INF), Criterion())
    out = e.to_json()

    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    parsed = json.loads(json.dumps(out), parse_constant=reject)
    assert parsed["rel_l2"] == "inf" and parsed["shape"] == [2] and parsed["target_inf"] == 1


@pytest.mark.parametrize(
    "precision, tol",
    [
        ("fp32", 1e-4),
        ("fp16", 1e-2),
        ("bf16", 5e-2),
        ("tf32", 1e-2),
        ("int8", 1e-1),
        ("unknown", 1e-4),
    ],
)
def test_default_tolerance_by_precision(precision, tol):
    crit = Criterion.for_precision(precision)
    assert crit.metric is Metric.REL_L2 and crit.tolerance == tol


def test_explicit_tolerances_override_defaults():
    crit = Criterion.for_precision("fp16", "allclose", tolerance=0.3, atol=0.2, rtol=0.1)
    assert (crit.metric, crit.tolerance, crit.atol, crit.rtol) == (Metric.ALLCLOSE, 0.3, 0.2, 0.1)
    assert crit.describe() == "allclose(atol=0.2, rtol=0.1)"
    assert Criterion.for_precision("bf16").describe() == "rel-l2 <= 0.05"
    assert set(DEFAULT_TOLERANCE) >= {"fp32", "fp16", "bf16"}


def test_opaque_byte_arrays_compare_by_equality_never_crash():
    """A dtype numpy cannot name (raw bytes, |V2) is compared byte for byte: never an internal
    error, never a float conversion."""
    from reprokit.standalone.compare import Criterion, compare_arrays

    criterion = Criterion.for_precision("fp32", "rel-l2", None, None, None)
    a = np.frombuffer(b"\x00\x3c\x00\x40", dtype="V2")
    same = compare_arrays("z", a, a.copy(), criterion)
    other = compare_arrays("z", a, np.frombuffer(b"\x00\x3c\x00\x41", dtype="V2"), criterion)
    assert not same.exceeds and same.error == 0.0
    assert other.exceeds and other.mismatched == 2


def test_narrow_float_and_int4_outputs_compare_by_value_not_as_bytes():
    """bfloat16/float8/int4 (ml_dtypes, opaque to numpy) compare as numbers: a one-ulp bf16
    difference is a small error, not inf; a NaN in a float8 reference is seen."""
    import ml_dtypes

    from reprokit.engine.oracle import check_reference_finite
    from reprokit.errors import ReferenceFailure

    criterion = Criterion.for_precision("bf16", "rel-l2", None, None, None)
    ref = np.array([1.0, 2.0, 3.0, 4.0], dtype=ml_dtypes.bfloat16)
    near = np.array([1.0, 2.0, 3.015625, 4.0], dtype=ml_dtypes.bfloat16)
    found = compare_arrays("y", ref, near, criterion)
    assert 0 < found.error < 0.01 and not found.exceeds
    far = compare_arrays("y", ref, np.array([1.0, 2.0, 30.0, 4.0], dtype=ml_dtypes.bfloat16), criterion)
    assert np.isfinite(far.error) and far.exceeds
    ints = compare_arrays("q", np.array([1, -2, 3], dtype=ml_dtypes.int4), np.array([1, -2, 4], dtype=ml_dtypes.int4),
                          criterion)
    assert ints.max_abs == 1.0
    with pytest.raises(ReferenceFailure):
        check_reference_finite({"y": np.array([1.0, np.nan], dtype=ml_dtypes.float8_e4m3fn)}, "ort")


@pytest.mark.parametrize("metric", list(Metric))
def test_a_short_comparison_gives_the_same_verdict_numbers_as_a_full_one(metric):
    """full=False (pack members) leaves out only what the criterion's metric does not read; its
    float32 numbers (test_compare_float32.py) equal the full ones to float32 rounding, its verdict
    exactly."""
    rng = np.random.default_rng(7)
    reference = rng.standard_normal(5000).astype(np.float32)
    criterion = Criterion.for_precision("fp16", metric)
    for target in (reference + 1e-4, reference * 1.5, np.where(reference > 2, np.inf, reference),
                   np.where(reference > 2, np.nan, reference)):
        full = compare_arrays("y", reference, target.astype(np.float32), criterion)
        short = compare_arrays("y", reference, target.astype(np.float32), criterion, full=False)
        assert short.exceeds == full.exceeds
        assert (short.error, short.rel_l2, short.max_abs) == pytest.approx((full.error, full.rel_l2, full.max_abs),
                                                                           rel=1e-5)
        assert (short.target_nan, short.target_inf, short.nonfinite_in_target_only) == (
            full.target_nan, full.target_inf, full.nonfinite_in_target_only)


def test_norms_are_blas_norms_to_the_last_bits():
    """compare.py sums squares with einsum (no BLAS threads); the numbers stay numpy's."""
    rng = np.random.default_rng(3)
    for size in (0, 1, 7, 100_000):
        values = rng.standard_normal(size) * 1e3
        target = values + rng.standard_normal(size)
        error = compare_arrays("y", values, target, Criterion())
        expect = np.linalg.norm(target - values) / np.linalg.norm(values) if size else 0.0
        assert error.rel_l2 == pytest.approx(expect, rel=1e-12)
