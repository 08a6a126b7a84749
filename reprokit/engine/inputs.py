"""Feeds: the arrays fed to a model (:class:`Feeds`), seeded random data, ``--input-shapes`` and
``--val-range`` parsing, validation against the model, and saving the feeds actually used.
Reading feeds from files is :mod:`reprokit.engine.feedfiles`'s.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from reprokit.engine.memorybound import half_the_memory, parse_size, size_words  # noqa: F401  (re-exported: callers' import)
from reprokit.errors import InputError, UsageError
from reprokit.graph.dims import choose
from reprokit.graph.model import InputInfo
from reprokit.standalone.arrays import save_npz

DEFAULT_RANGE = (0.0, 1.0)


def memory_bound() -> int:
    """Bytes of feeds reprokit will hold: half this machine's physical memory. The reference and
    the target each load the feeds beside their engine, so more never runs; refusing first is
    one clear error where allocating was a MemoryError (exit 70) or the kernel's OOM killer."""
    return half_the_memory()


@dataclass
class Feeds:
    """The arrays fed to the model plus notes about how they were made (shown to the user)."""

    arrays: dict[str, np.ndarray]
    source: str
    notes: list[str] = field(default_factory=list)


def parse_shape_args(values: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """``x:1x3x224x224`` or ``x:[1,3,224,224]``; several per argument, space separated.
    Names may hold colons themselves (``input:0:1x3``): the last colon separates the dims."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        for item in re.findall(r"[^\s\[]+:\[[^\]]*\]|\S+", value):
            name, sep, dims = item.rpartition(":")
            text = dims.strip()
            bracketed = re.fullmatch(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]", text)
            plain = re.fullmatch(r"\d+(?:x\d+)*", text)
            if not sep or not name or not (bracketed or plain):
                raise UsageError(
                    f"cannot parse input shape {item!r}",
                    hint="write NAME:1x3x224x224 or NAME:[1,3,224,224]",
                )
            parts = re.split(r"[x,]", text.strip("[] ")) if text.strip("[] ") else []
            shapes[name] = tuple(int(p) for p in parts)
            if 0 in shapes[name]:
                raise UsageError(f"input shape {item!r} has a dimension of 0: every dimension must be at least 1",
                                 hint=f"e.g. {name}:{'x'.join(str(d or 1) for d in shapes[name])}")
    return shapes


def parse_val_ranges(values: tuple[str, ...] | list[str]) -> dict[str | None, tuple[float, float]]:
    """``name:[lo,hi]`` or ``[lo,hi]`` (all inputs)."""
    ranges: dict[str | None, tuple[float, float]] = {}
    for value in values:
        match = re.fullmatch(r"\s*(?:(.+?):)?\[\s*([^,\]]+)\s*,\s*([^\]]+)\s*\]\s*", value)
        try:
            if not match:
                raise ValueError
            lo, hi = float(match.group(2)), float(match.group(3))
        except ValueError:
            raise UsageError(f"cannot parse value range {value!r}",
                             hint="write NAME:[LO,HI] or [LO,HI], e.g. x:[-1,1]") from None
        if not math.isfinite(hi - lo):  # NaN, an infinity, or a width past float64 (numpy cannot draw)
            raise UsageError(f"value range {value!r} is not a finite range of numbers",
                             hint="write [LO,HI] with finite numbers whose difference fits a float64, e.g. x:[-1e4,1e4]")
        if lo > hi:
            raise UsageError(f"value range {value!r} has lo > hi", hint="write [LO,HI] with LO <= HI")
        ranges[match.group(1)] = (lo, hi)
    return ranges


def resolved_shape(info: InputInfo, shapes: dict[str, tuple[int, ...]], notes: list[str],
                   hints: dict[str, str] | None = None) -> tuple[int, ...]:
    """The shape to feed: given, static, or with its dynamic dims chosen (reprokit.graph.dims) and said
    in ``notes``. ``hints``: the model's metadata (``dims.metadata_hints``)."""
    if info.name in shapes:
        return shapes[info.name]
    if info.is_static:
        return tuple(int(d) for d in info.shape)

    guess = choose(info.name, tuple(info.shape), hints)
    notes.append(guess.note())
    return guess.dims


def random_feeds(
    infos: list[InputInfo],
    *,
    seed: int = 0,
    shapes: dict[str, tuple[int, ...]] | None = None,
    val_ranges: dict[str | None, tuple[float, float]] | None = None,
    hints: dict[str, str] | None = None,
) -> Feeds:
    """Seeded random data per dtype: floats uniform in [lo, hi) (default [0, 1)), ints in
    [lo, hi] (default [0, 1]... wide enough to index nothing out of range), bools fair coins."""
    shapes = shapes or {}
    val_ranges = val_ranges or {}
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    unknown = [n for n in val_ranges if n is not None and n not in {i.name for i in infos}]
    if unknown:
        raise InputError(f"--val-range names {unknown[0]!r}, which is not an input of the model",
                         hint=f"model inputs: {', '.join(i.name for i in infos)}")
    arrays = {}
    planned = 0
    for info in infos:
        if info.kind != "tensor":
            raise InputError(f"model input {info.name!r} is a{'n' if info.kind[0] == 'o' else ''} {info.kind}, "
                             "not a tensor: reprokit makes random feeds for tensors only",
                             hint="pass --inputs: an ONNX test_data_set_N folder, or an .npz with one member per "
                                  f"element ({info.name}[0], {info.name}[1], …)")
        shape = resolved_shape(info, shapes, notes, hints)
        # numpy draws in 64 bits, then casts: the draw is the peak
        planned += int(np.prod(shape, dtype=object)) * max(8, info.dtype.itemsize)
        if planned > memory_bound():
            given = info.name in shapes
            raise (UsageError if given else InputError)(
                f"random feeds for input {info.name!r} {list(shape)} (with the inputs before it) need "
                f"{size_words(planned)}, more than half this machine's memory ({size_words(2 * memory_bound())})",
                hint="give smaller dimensions with --input-shapes" if given else
                     "give its dynamic dimensions with --input-shapes, or real data with --inputs")
        lo, hi = val_ranges.get(info.name, val_ranges.get(None, DEFAULT_RANGE))
        kind = info.dtype.kind
        if kind == "O":  # ONNX STRING: short seeded words (--val-range does not apply)
            words = rng.integers(0, 26 ** 3, size=shape)
            arrays[info.name] = np.vectorize(_word, otypes=[object])(words) if words.size else words.astype(object)
        elif kind == "b":
            arrays[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif kind in "iu":
            # drawn as int64, then cast: a value outside the input's type would wrap (uint8 300 -> 44);
            # the top is the largest float64 below 2**63, so the range a hint prints parses back
            limits = np.iinfo(info.dtype)
            low, high = max(int(limits.min), -(2**63)), min(int(limits.max), 2**63 - 1024)
            if not low <= int(lo) <= int(hi) <= high:
                raise UsageError(f"value range [{lo:g},{hi:g}] does not fit input {info.name!r}: {info.dtype} "
                                 f"random feeds are drawn in [{low},{high}]",
                                 hint=f"e.g. --val-range {info.name}:[{max(int(lo), low)},{min(int(hi), high)}]")
            arrays[info.name] = rng.integers(int(lo), int(hi) + 1, size=shape).astype(info.dtype)
        else:
            arrays[info.name] = rng.uniform(lo, hi, size=shape).astype(info.dtype)
    return Feeds(arrays, f"random (seed {seed})", notes)


def _word(number: int) -> str:
    return "".join(chr(97 + (int(number) // 26 ** k) % 26) for k in range(3))


def astype_hint(dtype: np.dtype) -> str:
    """How to convert an array to ``dtype``, in calls that exist in every NumPy reprokit runs
    with (``np.object``, ``np.bool`` … were removed in NumPy 1.24)."""
    if dtype.kind == "O":
        return "np.asarray(array, dtype=object) (ONNX strings: an array of Python str)"
    if dtype.isbuiltin == 2:  # ml_dtypes' bfloat16, float8_*, int4 …
        return f"array.astype(ml_dtypes.{dtype.name})"
    if dtype.kind == "b":
        return "array.astype(np.bool_)"  # np.bool: gone from NumPy 1.24 to 1.26
    return f"array.astype(np.{np.dtype(dtype).type.__name__})"


def validate_feeds(arrays: dict[str, np.ndarray], infos: list[InputInfo]) -> None:
    """Names, dtypes and static dims must match the model; say exactly what is wrong."""
    expected = {i.name: i for i in infos}
    for name in arrays:
        if name not in expected:
            raise InputError(f"the inputs name {name!r}, which is not an input of the model",
                             hint=f"model inputs: {', '.join(expected) or '(none)'}")
    for info in infos:
        if info.name not in arrays:
            if info.kind.startswith("optional"):
                arrays[info.name] = None  # an optional left out is an empty optional
                continue
            raise InputError(f"the inputs lack model input {info.name!r}",
                             hint="provide every input, or drop --inputs to use random data")
        value = arrays[info.name]
        if info.kind != "tensor":
            _validate_container(info, value)
            continue
        if isinstance(value, list) or value is None:
            raise InputError(f"input {info.name!r} is a {'sequence' if value is not None else 'empty optional'} "
                             "in the inputs, the model expects a tensor", hint="feed a tensor")
        array = value
        if info.dtype.kind == "O" and array.dtype.kind == "U":
            # np.savez keeps strings as fixed-width unicode; onnxruntime takes them as object arrays
            array = arrays[info.name] = array.astype(object)
        if array.dtype != info.dtype:
            raise InputError(
                f"input {info.name!r} has dtype {array.dtype}, the model expects {info.dtype}",
                hint=f"convert it, e.g. {astype_hint(info.dtype)}",
            )
        if len(array.shape) != len(info.shape):
            raise InputError(
                f"input {info.name!r} has shape {list(array.shape)}, the model expects rank {len(info.shape)} {list(info.shape)}",
                hint="reshape the array to the model's input shape",
            )
        for axis, (have, want) in enumerate(zip(array.shape, info.shape)):
            if isinstance(want, int) and want > 0 and have != want:
                raise InputError(
                    f"input {info.name!r} has shape {list(array.shape)}, the model expects {list(info.shape)} (dim {axis})",
                    hint="reshape the array, or re-export the model with dynamic dims",
                )


def _validate_container(info: InputInfo, value) -> None:
    """A sequence or optional feed: the right kind of value, every element of the right dtype."""
    if value is None:
        if not info.kind.startswith("optional"):
            raise InputError(f"input {info.name!r} is empty, the model expects a {info.kind}", hint="feed a value")
        return
    wants_list = info.kind in ("sequence", "optional-sequence")
    if wants_list != isinstance(value, list):
        raise InputError(f"input {info.name!r} is a {'sequence' if isinstance(value, list) else 'tensor'} in the "
                         f"inputs, the model expects a{'n' if info.kind[0] == 'o' else ''} {info.kind}",
                         hint=f"feed {'a list of tensors' if wants_list else 'one tensor'}")
    for index, element in enumerate(value if wants_list else [value]):
        if np.asarray(element).dtype != info.dtype and not (info.dtype.kind == "O" and np.asarray(element).dtype.kind in "OU"):
            where = f"element {index} of " if wants_list else ""
            raise InputError(f"{where}input {info.name!r} has dtype {np.asarray(element).dtype}, the model expects "
                             f"{info.dtype}", hint=f"convert it, e.g. {astype_hint(info.dtype)}")


def feed_shape(value) -> list:
    """A feed's shape for display: a tensor's, one list per element of a sequence, None for an
    empty optional."""
    if value is None:
        return None
    if isinstance(value, list):
        return [list(np.shape(v)) for v in value]
    return list(np.shape(value))


def feed_dtype(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "sequence(" + (str(np.asarray(value[0]).dtype) if value else "") + ")"
    return str(np.asarray(value).dtype)


def save_feeds(path: str, arrays: dict[str, np.ndarray]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    return save_npz(path, arrays)
