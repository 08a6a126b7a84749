"""What an array's values say by themselves, before any comparison: a reference too degenerate
for a relative error (all zero, near zero, one constant), and whether a narrow storage type
(fp16, bf16, fp8) can hold the values.

Standalone: numpy only, embedded verbatim in repro.py above ``compare.py`` (which reads it), so
an archive counts as reprokit counts. Must not compare two arrays or judge a verdict: that is
``compare.py``'s and ``engine/oracle.py``'s.
"""

from __future__ import annotations

import numpy as np

# Below sqrt(float32 eps) ~ 3.5e-4 everywhere, an output is a saturated tail (a sigmoid
# of very negative logits, a residual that cancels): its relative error is the logits' absolute
# error, so even an fp32 reordering of the same sums "diverges" by percents.
NEAR_ZERO = float(np.sqrt(np.finfo(np.float32).eps))


def degenerate_reference(reference) -> str | None:
    """Why a relative error on this reference output says little, or None: every value (near)
    zero, or one constant value. Float outputs only."""
    ref = np.asarray(reference)
    if ref.dtype.kind != "f" or ref.size == 0:
        return None
    values = ref.astype(np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    low, high = float(values.min()), float(values.max())
    if high == 0.0 and low == 0.0:
        return "every value is 0"
    biggest = max(abs(low), abs(high))
    if biggest < NEAR_ZERO:
        return f"near zero everywhere (max |ref| = {biggest:.2g})"
    if values.size > 1 and low == high:
        return f"constant (every value = {low:.6g})"
    return None


# Largest finite value and the magnitude below which a value rounds to zero, per storage type.
RANGE = {"fp16": (65504.0, 2.9802322e-08), "bf16": (3.3895314e38, 4.6e-41), "fp8": (448.0, 9.8e-4)}
UNDERFLOW_SHARE = 0.01


def unrepresentable(array, precision: str) -> str | None:
    """Why ``array`` cannot be held in the target's narrow storage type, or None.

    Any value past the type's maximum (it would become inf), or at least 1 % of the non-zero
    values flushing to zero, counts: a cut fed with such a tensor moves the fault into the data.
    """
    limits = RANGE.get(precision)
    values = np.asarray(array)
    if limits is None or values.dtype.kind != "f" or values.size == 0:
        return None
    high, tiny = limits
    magnitude = np.abs(values).reshape(-1)
    top = magnitude.max()
    if not np.isfinite(top):  # NaN or inf: the finite values alone are judged
        magnitude = magnitude[np.isfinite(magnitude)]
        top = magnitude.max() if magnitude.size else 0.0
    over = int(np.count_nonzero(magnitude > high)) if top > high else 0
    if over:
        return f"{over} values beyond the {precision} maximum {high:g}"
    # counted from the values below ``tiny`` alone (few, or none): a pass over the cut tensors of
    # every candidate of a survey (a Swin: 664 tensors of ~1 MB) copies no other value
    small = magnitude[magnitude < tiny]
    under = int(np.count_nonzero(small))
    nonzero = magnitude.size - (small.size - under)
    if nonzero and under >= UNDERFLOW_SHARE * nonzero:
        return f"{under} of {nonzero} non-zero values flush to zero in {precision}"
    return None
