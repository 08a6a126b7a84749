"""Feeds read from files: .npz (members ``NAME@N``: sample N), polygraphy JSON (a list: several
samples), ONNX ``test_data_set`` folders (a folder of ``test_data_set_N`` folders: several
samples); loaded arrays cast to the model's dtypes where the meaning is kept, then validated.
Feeds made, parsed, validated and saved are :mod:`reprokit.engine.inputs`'s.
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np

from reprokit.engine.inputs import Feeds, memory_bound, size_words, validate_feeds
from reprokit.errors import InputError, UsageError
from reprokit.graph.model import InputInfo
from reprokit.standalone.arrays import load_npz


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
    if not os.path.isfile(path):  # a FIFO blocked for ever, /dev/zero read until memory ran out
        raise InputError(f"--inputs {path} is not a regular file or a folder",
                         hint="pass an .npz, a polygraphy JSON file or a test_data_set folder")
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
    declared = _declared_bytes(path)
    if declared > memory_bound():  # a compressed bomb: zeros deflate about 1000 to 1
        raise InputError(f"{path} declares {size_words(declared)} of arrays, more than half this machine's "
                         f"memory ({size_words(2 * memory_bound())}); reprokit does not load it",
                         hint="feed fewer or smaller samples; an archive's inputs.npz that declares this much "
                              "is corrupt or hostile")
    try:
        return load_npz(path)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object" in str(exc).lower():
            raise InputError(f"{path} holds arrays that need pickling, which reprokit refuses ({exc})",
                             hint="save plain arrays with np.savez; strings as str arrays, "
                                  "e.g. np.savez(path, text=np.array(['a', 'b']))") from exc
        raise InputError(f"{path} has a corrupt or truncated array: {exc}",
                         hint="save the feeds again with np.savez(path, name=array, ...)") from exc
    except Exception as exc:  # zipfile.BadZipFile, OSError, EOFError ...
        raise InputError(f"cannot read {path} as .npz: {exc.__class__.__name__}: {exc}",
                         hint="save the feeds with np.savez(path, name=array, ...)") from exc


def _declared_bytes(path: str) -> int:
    """What the .npy headers of an .npz declare, read without reading a member's data (what was
    summed so far where a header is unreadable: loading the file then says what is wrong)."""
    import zipfile

    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as member:
                    major, _ = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(member)
                total += int(np.prod(shape, dtype=object)) * dtype.itemsize
    except Exception:  # noqa: BLE001 - a broken member: load_npz names it
        return total
    return total


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
