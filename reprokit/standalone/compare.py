"""Error numbers between a reference and a target array, and the tolerance policy inputs.

Owns metrics (relative L2, max-abs, cosine distance, elementwise allclose) and the default
tolerance per precision. Integer, bool and string outputs compare exactly (a class id or a token
id that flips is a bug whatever its relative error): any element that differs fails, and the
error is the count of differing elements. Complex outputs compare on both parts. Must not decide verdict policy: that is ``oracle.py``'s.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace

import numpy as np

from reprokit.standalone.values import degenerate_reference  # repro.py: embedded above


class Metric(str, enum.Enum):
    REL_L2 = "rel-l2"
    MAX_ABS = "max-abs"
    COSINE = "cosine"
    ALLCLOSE = "allclose"


# Default relative-L2 tolerance per target precision. The unit roundoff u of a format bounds the
# relative error of one rounding; through a network of depth d errors of independent roundings
# grow roughly like sqrt(d)·u, so the default is ~20-100·u: fp32 u=6e-8 but kernels reorder sums
# (1e-4); tf32/fp16 u=4.9e-4 (1e-2, NVIDIA's own FP16 parity advice); bf16 u=3.9e-3 (5e-2);
# int8/fp8 quantization steps of 1/127 to 1/8 of the range (1e-1, 2e-1).
DEFAULT_TOLERANCE = {
    "fp32": 1e-4,
    "tf32": 1e-2,
    "fp16": 1e-2,
    "bf16": 5e-2,
    "int8": 1e-1,
    "fp8": 2e-1,
}
# For max-abs and cosine the same numbers serve as absolute error and 1-cos bounds.
DEFAULT_ATOL = {"fp32": 1e-5, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2, "int8": 1e-1, "fp8": 2e-1}


@dataclass(frozen=True)
class Criterion:
    """How outputs are judged: a metric and its bound (atol/rtol for allclose)."""

    metric: Metric = Metric.REL_L2
    tolerance: float = 1e-2
    atol: float = 1e-2
    rtol: float = 1e-2

    @classmethod
    def for_precision(
        cls,
        precision: str,
        metric: Metric | str = Metric.REL_L2,
        tolerance: float | None = None,
        atol: float | None = None,
        rtol: float | None = None,
    ) -> Criterion:
        metric = Metric(metric)
        default = DEFAULT_TOLERANCE.get(precision, DEFAULT_TOLERANCE["fp32"])
        default_atol = DEFAULT_ATOL.get(precision, DEFAULT_ATOL["fp32"])
        return cls(
            metric=metric,
            tolerance=tolerance if tolerance is not None else default,
            atol=atol if atol is not None else default_atol,
            rtol=rtol if rtol is not None else default_atol,
        )

    def describe(self) -> str:
        if self.metric is Metric.ALLCLOSE:
            return f"allclose(atol={self.atol:g}, rtol={self.rtol:g})"
        return f"{self.metric.value} <= {self.tolerance:g}"


@dataclass(frozen=True)
class OutputError:
    """Numbers for one output. ``error`` is the chosen metric's value; ``exceeds`` its verdict."""

    name: str
    shape: tuple[int, ...]
    rel_l2: float
    max_abs: float
    cosine_distance: float
    max_abs_reference: float
    target_nan: int
    target_inf: int
    reference_nan: int
    reference_inf: int
    mismatched: int  # elements failing allclose(atol, rtol)
    error: float
    exceeds: bool
    target_shape: tuple[int, ...] | None = None  # set only when it differs from ``shape``
    reference_note: str = ""  # why relative error means little on this reference (degenerate_reference)
    exact: bool = False  # integer/bool/string: compared element by element, ``error`` counts the differing ones

    @property
    def shape_mismatch(self) -> bool:
        return self.target_shape is not None and tuple(self.target_shape) != tuple(self.shape)

    @property
    def nonfinite_in_target_only(self) -> bool:
        return (self.target_nan + self.target_inf) > (self.reference_nan + self.reference_inf)

    def to_json(self) -> dict:
        out = asdict(self)
        out["shape"] = list(self.shape)
        out["target_shape"] = list(self.target_shape if self.target_shape is not None else self.shape)
        return jsonable(out)


def jsonable(value):
    """``value`` as every reprokit JSON writes it: JSON has no inf/nan, so non-finite floats become
    strings (``"inf"``, ``"nan"``); dicts, lists and tuples converted item by item; numpy scalars
    become Python numbers; anything else (None, int, str) as it is."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if np.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def widen(array):
    """bfloat16, float8 and int4/uint4 arrays (ml_dtypes, dtype kind "V" to numpy) as float32 /
    int8 / uint8, so they compare by value and their NaN/Inf are seen; anything else as it is."""
    array = np.asarray(array)
    if array.dtype.kind != "V":
        return array
    name = array.dtype.name
    try:
        if "float" in name:
            return array.astype(np.float32)
        if name.startswith(("int", "uint")):
            return array.astype(np.uint8 if name.startswith("u") else np.int8)
    except (TypeError, ValueError):
        pass
    return array


def compare_arrays(name: str, reference, target, criterion: Criterion, *, full: bool = True,
                   reference_sums: tuple[float, float] | None = None) -> OutputError:
    """All numbers for one output pair. Different shapes give an error of inf and record the
    target's shape (``shape_mismatch``): the oracle names that, not the inf.

    ``full=False`` (layerwise tables over thousands of tensors) skips the cosine distance and
    the allclose count unless the criterion's metric needs them (they read as nan and 0).
    ``reference_sums``: :func:`reference_sums` of ``reference``, when the caller kept them (a
    captured activation judged against many candidates' outputs); the same numbers either way."""
    ref = widen(reference)
    tgt = widen(target)
    if ref.shape != tgt.shape:
        inf = float("inf")
        ref_nan, ref_inf = _nonfinite(ref)
        tgt_nan, tgt_inf = _nonfinite(tgt)
        return OutputError(name, tuple(ref.shape), inf, inf, inf, _max_abs(ref), tgt_nan, tgt_inf,
                           ref_nan, ref_inf, int(ref.size), inf, True, tuple(tgt.shape))
    if ref.dtype.kind == "V" or tgt.dtype.kind == "V":
        # Opaque bytes (a dtype numpy cannot name): equal or not, element by element.
        same = ref.dtype == tgt.dtype and ref.tobytes() == tgt.tobytes()
        gap = 0.0 if same else float("inf")
        differ = 0 if same else int(ref.size)
        return OutputError(name, tuple(ref.shape), gap, gap, gap, 0.0, 0, 0, 0, 0, differ, float(differ), not same,
                           exact=True)
    if ref.dtype.kind in "OSU" or tgt.dtype.kind in "OSU":
        # Strings have no distance: equal or not, elementwise.
        differ = int(np.count_nonzero(ref.astype(str) != tgt.astype(str)))
        gap = float("inf") if differ else 0.0
        return OutputError(name, tuple(ref.shape), gap, gap, gap, 0.0, 0, 0, 0, 0, differ, float(differ),
                           bool(differ), exact=True)
    if not full and ref.dtype == np.float32 and tgt.dtype == np.float32:
        quick = _float32_error(name, ref, tgt, criterion, reference_sums)
        if quick is not None:
            return quick
    exact = ref.dtype.kind in "biu" and tgt.dtype.kind in "biu"
    r, t = _as_float64(ref), _as_float64(tgt)
    finite_r, finite_t = np.isfinite(r), np.isfinite(t)
    all_finite = bool(finite_r.all()) and bool(finite_t.all())
    ref_nan, ref_inf = (0, 0) if all_finite else _nonfinite(r)
    tgt_nan, tgt_inf = (0, 0) if all_finite else _nonfinite(t)
    with np.errstate(invalid="ignore", over="ignore"):
        if all_finite:
            same_nonfinite = None
            diff = t - r
            ref_norm = _norm(r)
        else:
            same_nonfinite = (~finite_r) & ((r == t) | (np.isnan(r) & np.isnan(t)))
            diff = np.where(same_nonfinite, 0.0, t - r)
            ref_norm = _norm(np.where(finite_r, r, 0.0))
        diff_norm = _norm(diff) if diff.size else 0.0
        if np.isnan(diff_norm):
            diff_norm = float("inf")
        rel_l2 = diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else float("inf"))
        max_abs = float(max(np.max(diff), -np.min(diff))) if diff.size else 0.0
        if np.isnan(max_abs):
            max_abs = float("inf")
        need = full or criterion.metric in (Metric.COSINE, Metric.ALLCLOSE)
        cosine, mismatched = float("nan"), 0
        if need:
            if same_nonfinite is None:
                cosine = _cosine_distance(r, t)
            else:
                cosine = _cosine_distance(np.where(same_nonfinite, 0.0, r), np.where(same_nonfinite, 0.0, t))
            close = np.isclose(t, r, atol=criterion.atol, rtol=criterion.rtol, equal_nan=True)
            mismatched = int(close.size - int(np.count_nonzero(close)))
        max_ref = float(np.max(np.abs(r))) if all_finite and r.size else _max_abs(ref)
    error = {
        Metric.REL_L2: rel_l2,
        Metric.MAX_ABS: max_abs,
        Metric.COSINE: cosine,
        Metric.ALLCLOSE: float(mismatched),
    }[criterion.metric]
    exceeds = mismatched > 0 if criterion.metric is Metric.ALLCLOSE else not (error <= criterion.tolerance)
    if exact:  # ids, indices, masks: any element that differs is a divergence
        mismatched = int(np.count_nonzero(r != t))
        error, exceeds = float(mismatched), mismatched > 0
    return OutputError(
        name, tuple(ref.shape), rel_l2, max_abs, cosine, max_ref, tgt_nan, tgt_inf, ref_nan,
        ref_inf, mismatched, error, bool(exceeds),
        reference_note=(degenerate_reference(ref) or "") if full and not exact else "", exact=exact,
    )


# A float32 pair judged without float64 copies (``_float32_error``) is re-judged the float64 way
# when its error lies this close to the bound. The float32 numbers are within ~4e-6 (relative)
# of the exact ones: one rounding of each difference and each square (2**-24), numpy's pairwise
# summation of non-negative terms (under (16 + log2 n)·2**-24 for n < 2**30), halved by the sqrt.
# The float64 way is within ~1e-8. Outside this margin, 25 times wider, both sides of ``<=`` agree.
FLOAT32_MARGIN = 1e-4
# Sums of squares below this may have lost subnormal squares (each under 2**-126): float64 way.
_SMALLEST_SUM = 1e-20


def reference_sums(reference: np.ndarray) -> tuple[float, float]:
    """(sum of squares, largest magnitude) of a float32 reference as the float32 comparison
    computes them (pairwise sum in float32): what a caller may keep per reference."""
    values = np.asarray(reference).reshape(-1)
    if values.size == 0:
        return 0.0, 0.0
    return float(np.add.reduce(np.square(values))), float(max(np.max(values), -np.min(values)))


def _float32_error(name: str, ref: np.ndarray, tgt: np.ndarray, criterion: Criterion,
                   sums: tuple[float, float] | None = None) -> OutputError | None:
    """The numbers ``compare_arrays(full=False)`` reads, for two finite float32 arrays of one
    shape, without float64 copies (a survey pack's thousand members: ~10x faster, a quarter of
    the memory): the difference, its squares and their pairwise sums in float32. None — the
    caller's float64 way decides — for a non-finite value or difference, a metric other than
    rel-l2 and max-abs, a sum that may have under- or overflowed, or an error within
    ``FLOAT32_MARGIN`` of the bound."""
    if criterion.metric not in (Metric.REL_L2, Metric.MAX_ABS):
        return None
    r, t = ref.reshape(-1), tgt.reshape(-1)
    if r.size == 0:
        return None
    diff = np.subtract(t, r)
    # NaN or inf anywhere in either array (or a difference past float32) makes this non-finite
    max_abs = float(max(np.max(diff), -np.min(diff)))
    if not np.isfinite(max_abs):
        return None
    diff_sum = float(np.add.reduce(np.multiply(diff, diff, out=diff)))
    ref_sum, max_ref = sums if sums is not None else reference_sums(r)
    if not (np.isfinite(diff_sum) and np.isfinite(ref_sum)) or ref_sum < _SMALLEST_SUM or (
            max_abs > 0 and diff_sum < _SMALLEST_SUM):
        return None
    rel_l2 = float(np.sqrt(diff_sum / ref_sum))
    error = rel_l2 if criterion.metric is Metric.REL_L2 else max_abs
    if abs(error - criterion.tolerance) <= FLOAT32_MARGIN * criterion.tolerance:
        return None
    return OutputError(name, tuple(ref.shape), rel_l2, max_abs, float("nan"), max_ref, 0, 0, 0, 0, 0, error,
                       not (error <= criterion.tolerance))


# FP8 formats: (largest finite value, mantissa bits, exponent of the smallest normal)
FLOAT8_FORMATS = {
    "float8e4m3fn": (448.0, 3, -6),
    "float8e4m3fnuz": (240.0, 3, -7),
    "float8e5m2": (57344.0, 2, -14),
    "float8e5m2fnuz": (57344.0, 2, -15),
}


def grid_spacing(kind: str, value: float) -> float:
    """The spacing of the FP8 format ``kind``'s grid at magnitude ``value`` (in units of the
    scale): one rounding flip there; subnormals share the smallest normal's spacing."""
    top, mantissa, emin = FLOAT8_FORMATS[kind]
    value = min(abs(float(value)), top)
    exponent = max(int(np.floor(np.log2(value))) if value > 0 else emin, emin)
    return float(2.0 ** (exponent - mantissa))


def step_at(step: float | None, float8: str | None, max_abs_reference: float) -> float | None:
    """The step an output is judged in: its scale, or for a tensor on an FP8 grid (``float8``:
    its format) the scale times the format's spacing at the reference's largest magnitude."""
    if not step or not float8:
        return step
    return step * grid_spacing(float8, max_abs_reference / step)


def judge_in_steps(error: OutputError, step: float | None, after_quantized: bool, fallback: float,
                   base: Criterion) -> OutputError:
    """One output of a quantized model, judged as reprokit judges it (engine/quantized.py; repro.py
    embeds this, so an archive judges exactly as the CLI did). ``step``: the output's quantization
    step (None: the model does not quantize it); ``after_quantized``: it is computed after a
    quantized op, then rel-l2 holds at ``fallback`` (the int8 tolerance) instead of the base one.
    Exact, reshaped and non-finite errors stay as they are."""
    if error.exact or error.shape_mismatch or not np.isfinite(error.max_abs):
        return error
    if step:
        gap = error.max_abs / step
        # one step is one rounding flip (half-even vs half-away, a wider accumulator): more than
        # one (beyond float noise on the step itself) diverges
        return replace(error, error=gap, exceeds=bool(gap > 1 + 1e-3))
    if after_quantized and base.metric is Metric.REL_L2:
        return replace(error, exceeds=bool(error.rel_l2 > max(fallback, base.tolerance)))
    return error


def _as_float64(array) -> np.ndarray:
    """The values as one flat float64 vector; a complex array as its real parts then its
    imaginary parts (casting it would drop the imaginary part)."""
    if array.dtype.kind == "c":
        return np.concatenate([array.real.ravel(), array.imag.ravel()]).astype(np.float64)
    return array.astype(np.float64).ravel()


def reference_warnings(outputs, metric: Metric | str) -> list[str]:
    """One line per output whose reference is degenerate: what the numbers cannot tell, and
    what to do instead (real inputs, or an absolute metric)."""
    relative = Metric(metric) in (Metric.REL_L2, Metric.COSINE)
    advice = "use real inputs (--inputs)" + (" or --metric max-abs" if relative else "")
    said = [f"reference output {o.name!r} is {o.reference_note}: its relative error is meaningless "
            f"there (the feeds barely exercise it); {advice}" for o in outputs
            if o.reference_note and (relative or not o.reference_note.startswith("near zero"))]
    return said + [f"reference output {o.name!r} holds {o.reference_inf} ±inf value(s): compared exactly there (the "
                   "same inf agrees, any other value is an infinite error); if that is an overflow of your inputs "
                   "rather than a value of the model (a -inf mask), use real inputs (--inputs)"
                   for o in outputs if getattr(o, "reference_inf", 0) and not getattr(o, "reference_nan", 0)]


def _nonfinite(array: np.ndarray) -> tuple[int, int]:
    if array.dtype.kind not in "fc":
        return 0, 0
    return int(np.count_nonzero(np.isnan(array))), int(np.count_nonzero(np.isinf(array)))


def _max_abs(array: np.ndarray) -> float:
    if array.size == 0 or array.dtype.kind not in "fciub":
        return 0.0
    finite = np.asarray(array, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def _cosine_distance(r: np.ndarray, t: np.ndarray) -> float:
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(t))):
        return float("inf")
    nr, nt = _norm(r), _norm(t)
    if nr == 0 and nt == 0:
        return 0.0
    if nr == 0 or nt == 0:
        return 1.0
    return float(max(0.0, 1.0 - float(np.einsum("i,i->", r, t)) / (nr * nt)))


def _norm(vector: np.ndarray) -> float:
    """The L2 norm of a flat float64 vector. Not np.linalg.norm: that is a BLAS dot, and a
    multithreaded BLAS (OpenBLAS by default) hands every mid-sized vector to its threads; on a
    busy machine that made comparing the members of PP-OCRv4 rec packs 43 s of an 85 s shrink (issue 25).
    einsum's own loop runs in this thread and gives the same sum to the last bits or so."""
    return float(np.sqrt(np.einsum("i,i->", vector, vector)))
