"""Feeds: load (.npz, polygraphy JSON, ONNX test_data_set folders), seeded random data,
shape parsing, validation against the model, and saving the feeds actually used.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

import numpy as np

from reprokit.errors import InputError, UsageError
from reprokit.graph.dims import choose
from reprokit.graph.model import InputInfo
from reprokit.standalone.arrays import load_npz, save_npz

DEFAULT_RANGE = (0.0, 1.0)


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
    for info in infos:
        if info.kind != "tensor":
            raise InputError(f"model input {info.name!r} is a{'n' if info.kind[0] == 'o' else ''} {info.kind}, "
                             "not a tensor: reprokit makes random feeds for tensors only",
                             hint="pass --inputs: an ONNX test_data_set_N folder, or an .npz with one member per "
                                  f"element ({info.name}[0], {info.name}[1], …)")
        shape = resolved_shape(info, shapes, notes, hints)
        lo, hi = val_ranges.get(info.name, val_ranges.get(None, DEFAULT_RANGE))
        kind = info.dtype.kind
        if kind == "b":
            arrays[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif kind in "iu":
            arrays[info.name] = rng.integers(int(lo), int(hi) + 1, size=shape).astype(info.dtype)
        else:
            arrays[info.name] = rng.uniform(lo, hi, size=shape).astype(info.dtype)
    return Feeds(arrays, f"random (seed {seed})", notes)


def load_feeds(path: str, infos: list[InputInfo], *, sample: int | None = 0) -> Feeds:
    """Load feeds from .npz, polygraphy JSON or a test_data_set folder and validate them: one
    sample, ``sample`` (None: the first) of a source that holds several (a note says so)."""
    samples = _read_samples(path, infos)
    index = 0 if sample is None else sample
    if not 0 <= index < len(samples):
        raise UsageError(f"--sample {index} is out of range: {path} has {len(samples)} "
                         f"sample{'s' if len(samples) != 1 else ''}",
                         hint=f"use --sample 0..{len(samples) - 1}")
    notes = [f"{path} has {len(samples)} samples; using sample {index} (--sample N picks another)"] \
        if len(samples) > 1 else []
    return _checked(samples[index], infos, path, notes, index if len(samples) > 1 else None)


def load_samples(path: str, infos: list[InputInfo]) -> list[Feeds]:
    """Every sample of ``path``, each loaded and validated like :func:`load_feeds`: a polygraphy
    JSON list, a folder of ``test_data_set_N`` folders, an .npz whose members ``name@N`` give
    sample N (members without ``@N`` are shared by every sample). One sample for anything else."""
    samples = _read_samples(path, infos)
    if len(samples) == 1:
        return [_checked(samples[0], infos, path, [], None)]
    return [_checked(arrays, infos, f"{path} sample {k}", [], k) for k, arrays in enumerate(samples)]


def _checked(arrays: dict, infos: list[InputInfo], source: str, notes: list[str], index: int | None) -> Feeds:
    try:
        notes.extend(cast_feeds(arrays, infos))
        validate_feeds(arrays, infos)
    except InputError as exc:
        if index is not None:  # say which sample is wrong
            exc.message = f"sample {index}: {exc.message}"
            exc.args = (exc.message,)
        raise
    return Feeds(arrays, source, notes)


def _read_samples(path: str, infos: list[InputInfo]) -> list[dict]:
    """The raw samples of an inputs file or folder, in order (at least one)."""
    if not os.path.exists(path):
        raise InputError(f"inputs file not found: {path}", hint="check the path given to --inputs")
    if os.path.isdir(path):
        sets = _test_data_sets(path)
        return [_load_test_data_set(folder, infos) for folder in sets] if sets else [_load_test_data_set(path, infos)]
    if path.endswith(".json"):
        return _load_polygraphy_json(path)
    return [_group_sequences(arrays, infos) for arrays in _split_samples(_load_npz(path), infos, path)]


def _test_data_sets(path: str) -> list[str]:
    """The ``test_data_set_N`` folders inside ``path`` (an ONNX model folder), by N; none when
    ``path`` holds ``input_*.pb`` files itself (it is one data set)."""
    if glob.glob(os.path.join(path, "input_*.pb")):
        return []
    found = [(int(m.group(1)), os.path.join(path, name)) for name in os.listdir(path)
             if (m := re.fullmatch(r"test_data_set_(\d+)", name)) and os.path.isdir(os.path.join(path, name))]
    return [folder for _, folder in sorted(found)]


SAMPLE_AXIS = re.compile(r"(.+)@(\d+)")  # an .npz member "x@2": input x of sample 2


def _split_samples(arrays: dict, infos: list[InputInfo], path: str) -> list[dict]:
    """An .npz's sample axis: ``x@0``, ``x@1`` … are input ``x`` of samples 0, 1 …; a member
    without ``@N`` (or named exactly like an input) is the same in every sample."""
    names = {i.name for i in infos}
    shared, indexed = {}, {}
    for key, value in arrays.items():
        match = SAMPLE_AXIS.fullmatch(key)
        if match and key not in names:
            indexed.setdefault(int(match.group(2)), {})[match.group(1)] = value
        else:
            shared[key] = value
    if not indexed:
        return [shared]
    count = max(indexed) + 1
    everyone = set().union(*indexed.values())
    for k in range(count):
        missing = sorted(everyone - set(indexed.get(k, {})))
        if missing:
            raise InputError(f"{path}: sample {k} lacks {', '.join(f'{n}@{k}' for n in missing)} (the samples are "
                             f"numbered 0..{count - 1} by the members' @N)",
                             hint="give every sample each input as NAME@N, N counting 0, 1, 2 …; a member without @N "
                                  "is shared by every sample")
    both = sorted(everyone & set(shared))
    if both:
        raise InputError(f"{path} has both {both[0]} and {both[0]}@N",
                         hint=f"keep {both[0]} (shared by every sample) or {both[0]}@0, {both[0]}@1 … (one per sample)")
    return [{**shared, **indexed[k]} for k in range(count)]


def cast_feeds(arrays: dict, infos: list[InputInfo]) -> list[str]:
    """Numeric feeds of another dtype than the model's, cast where the meaning is kept, with a
    note each (polygraphy's data loaders accept them too): float to float always (the change is
    rounding, and it is said how large), integers and integer-valued floats to integers, and
    integers to floats, only when every value survives exactly. Anything else is left for
    ``validate_feeds`` to refuse."""
    notes = []
    for info in infos:
        value = arrays.get(info.name)
        if info.kind != "tensor" or not isinstance(value, np.ndarray) or value.dtype == info.dtype:
            continue
        have, want = value.dtype.kind, info.dtype.kind
        if have not in "biuf" or want not in "biuf" or (want == "b") != (have == "b"):
            continue
        with np.errstate(all="ignore"):
            cast = value.astype(info.dtype)
            back = cast.astype(value.dtype)
        if have == "f" and want == "f":
            finite = np.isfinite(value)
            if not np.array_equal(np.isfinite(cast), finite):
                continue  # values past the narrower type's range: refused, not silently inf
            scale = np.abs(value[finite]).max(initial=0.0)
            change = float(np.abs(back[finite] - value[finite]).max(initial=0.0) / scale) if scale else 0.0
            how = "exactly" if change == 0 else f"max change {change:.2g} of max |x|"
        elif np.array_equal(back, value):
            how = "exactly"
        else:
            continue
        arrays[info.name] = cast
        notes.append(f"input {info.name!r}: {value.dtype} cast to the model's {info.dtype} ({how})")
    return notes


def _load_npz(path: str) -> dict[str, np.ndarray]:
    import zipfile

    if not zipfile.is_zipfile(path):
        raise InputError(f"cannot read {path} as .npz: it is not a zip archive of arrays",
                         hint="save the feeds with np.savez(path, name=array, ...)")
    try:
        return load_npz(path)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise InputError(f"{path} holds arrays that need pickling, which reprokit refuses ({exc})",
                             hint="save plain numeric arrays with np.savez") from exc
        raise InputError(f"{path} has a corrupt or truncated array: {exc}",
                         hint="save the feeds again with np.savez(path, name=array, ...)") from exc
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError ...
        raise InputError(f"cannot read {path} as .npz: {exc.__class__.__name__}: {exc}",
                         hint="save the feeds with np.savez(path, name=array, ...)") from exc


def _load_polygraphy_json(path: str) -> list[dict]:
    from polygraphy.json import load_json

    try:
        data = load_json(path)
    except Exception as exc:
        raise InputError(f"cannot read {path} as polygraphy JSON: {exc}",
                         hint="produce it with `polygraphy run ... --save-inputs inputs.json`") from exc
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise InputError(f"{path} is JSON but not a list of feed dicts", hint="use --save-inputs output")
    return [{k: np.asarray(v) for k, v in sample.items()} for sample in data]


def _load_test_data_set(path: str, infos: list[InputInfo]) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    files = sorted(glob.glob(os.path.join(path, "input_*.pb")), key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
    if not files and infos:  # a model without inputs has exactly this data set: an empty one
        raise InputError(f"{path} has no input_*.pb files", hint="pass an ONNX test_data_set_N folder")
    arrays = {}
    for index, file in enumerate(files):
        kind = infos[index].kind if index < len(infos) else "tensor"
        proto, convert, what = {
            "sequence": (onnx.SequenceProto, numpy_helper.to_list, "SequenceProto"),
            "optional": (onnx.OptionalProto, numpy_helper.to_optional, "OptionalProto"),
            "optional-sequence": (onnx.OptionalProto, numpy_helper.to_optional, "OptionalProto"),
        }.get(kind, (onnx.TensorProto, numpy_helper.to_array, "TensorProto"))
        if kind == "map":
            raise InputError(f"model input {infos[index].name!r} is a map (or another non-tensor type) that "
                             f"reprokit cannot feed ({file})", hint="feed tensors, sequences or optionals")
        message = proto()
        try:
            with open(file, "rb") as handle:
                message.ParseFromString(handle.read())
        except Exception as exc:
            raise InputError(f"cannot read {file} as a {what}: {exc}", hint="regenerate the test data") from exc
        name = message.name or (infos[index].name if index < len(infos) else f"input_{index}")
        try:
            arrays[name] = convert(message)
        except Exception as exc:  # a proto of another kind parses as a garbled one
            raise InputError(f"cannot read {file} as a {what} ({exc.__class__.__name__}: {exc})",
                             hint=f"the model declares input {name!r} as a {kind}; regenerate the test data") from exc
    return arrays


def _group_sequences(arrays: dict, infos: list[InputInfo]) -> dict:
    """An .npz feeds a sequence input ``s`` as members ``s[0]``, ``s[1]`` … (the way sequence
    outputs are written): gathered into a list here, unless ``s`` itself is there."""
    for info in infos:
        if info.kind not in ("sequence", "optional-sequence") or info.name in arrays:
            continue
        prefix = info.name + "["
        found = {k: v for k, v in arrays.items() if k.startswith(prefix) and k.endswith("]")
                 and k[len(prefix):-1].isdigit()}
        if found:
            order = sorted(found, key=lambda k: int(k[len(prefix):-1]))
            if [int(k[len(prefix):-1]) for k in order] != list(range(len(order))):
                raise InputError(f"sequence input {info.name!r}: members {', '.join(order)} do not count 0, 1, 2 …",
                                 hint=f"name the elements {info.name}[0], {info.name}[1], …")
            for key in order:
                del arrays[key]
            arrays[info.name] = [found[k] for k in order]
    return arrays


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
        if array.dtype != info.dtype:
            raise InputError(
                f"input {info.name!r} has dtype {array.dtype}, the model expects {info.dtype}",
                hint=f"convert it, e.g. array.astype(np.{info.dtype.name})",
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
                             f"{info.dtype}", hint=f"convert it, e.g. array.astype(np.{info.dtype.name})")


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
