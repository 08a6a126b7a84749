"""Array transport: ``.npz`` files that hold any tensor name and keep every ONNX dtype.

``np.savez(path, **arrays)`` breaks on names that are its own parameters (``file``,
``allow_pickle``), so members are written one by one here. Dtypes numpy's .npy format cannot
describe (bfloat16, float8, int4 from ml_dtypes) are stored as their raw unsigned-integer bits and
strings as unicode arrays; the real dtype is noted in the member's zip comment, which plain
``np.load`` ignores, so every file stays readable by any numpy. Loading never unpickles.

Standalone on purpose (numpy and the standard library only): repro.py embeds this module
verbatim, like compare.py and emulation.py.
"""

from __future__ import annotations

import zipfile

import numpy as np

_NOTE = b"reprokit-dtype:"
_SEQ = b"reprokit-seq:"  # member ``name[i]``: element i of the sequence ``name``
_NONE = b"reprokit-none"  # member ``name``: an empty optional
_STRING = "str"  # object arrays of Python strings (what onnxruntime returns for STRING tensors)


def save_npz(path: str, arrays: dict) -> str:
    """Write ``arrays`` (name → array) to ``path`` as an .npz; any name, any ONNX dtype.

    A sequence (a list of arrays, e.g. an ONNX sequence input) is written as members
    ``name[0]``, ``name[1]`` … (an empty one as ``name[]``), an empty optional (None) as an
    empty member ``name``; zip comments mark them, so ``load_npz`` gives back the list / None."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            if value is None:
                _write_member(archive, name, np.zeros(0, np.float32), _NONE)
            elif isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    _write_member(archive, f"{name}[{index}]", np.asarray(item), _SEQ + str(index).encode())
                if not value:
                    _write_member(archive, f"{name}[]", np.zeros(0, np.float32), _SEQ + b"empty")
            else:
                _write_member(archive, name, np.asarray(value), b"")
    return path


def _write_member(archive, name: str, array: np.ndarray, mark: bytes) -> None:
    stored, note = storable(array)
    info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
    info.comment = b"\n".join(part for part in (_NOTE + note.encode() if note else b"", mark) if part)
    with archive.open(info, "w", force_zip64=True) as member:
        np.lib.format.write_array(member, stored, allow_pickle=False)


def load_npz(path: str) -> dict:
    """Read an .npz written by ``save_npz`` or ``np.savez``; dtypes noted by ``save_npz`` are
    restored, and so are its sequences (lists) and empty optionals (None). Raises ValueError
    for object arrays (pickles are never loaded)."""
    notes, marks = {}, {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            for part in info.comment.split(b"\n"):
                if part.startswith(_NOTE):
                    notes[info.filename[:-4]] = part[len(_NOTE):].decode("ascii", "replace")
                elif part.startswith((_SEQ, _NONE)):
                    marks[info.filename[:-4]] = part
    with np.load(path, allow_pickle=False) as data:
        plain = {name: restored(np.array(data[name]), notes.get(name)) for name in data.files}
    if not marks:
        return plain
    out: dict = {}
    sequences: dict = {}
    for name, value in plain.items():
        mark = marks.get(name, b"")
        if mark == _NONE:
            out[name] = None
        elif mark.startswith(_SEQ) and name.endswith("]") and "[" in name:
            base = name[:name.rindex("[")]
            items = sequences.setdefault(base, {})
            out.setdefault(base, items)  # keeps the member order of the file
            if mark != _SEQ + b"empty":
                items[int(mark[len(_SEQ):])] = value
        else:
            out[name] = value
    for base, items in sequences.items():
        out[base] = [items[i] for i in sorted(items)]
    return out


def storable(array: np.ndarray) -> tuple[np.ndarray, str]:
    """The array numpy's .npy format can hold without pickling, and the dtype note to restore it."""
    if array.dtype.kind == "O":
        if all(isinstance(v, str) for v in array.flat):
            return array.astype(np.str_), _STRING
        return array, ""  # write_array refuses it: a clear error, never a pickle
    if array.dtype.isbuiltin == 2 and array.dtype.itemsize in (1, 2, 4, 8):
        # user-defined dtypes (ml_dtypes: bfloat16, float8_*, int4 ...) describe themselves in
        # .npy headers as void or as a float numpy cannot read back ('<f1')
        return array.view(f"u{array.dtype.itemsize}"), array.dtype.name
    return array, ""


def restored(array: np.ndarray, note: str | None) -> np.ndarray:
    if not note:
        return array
    if note == _STRING:
        return array.astype(object)
    import ml_dtypes

    # the note comes from the file: only a scalar type ml_dtypes defines is looked up
    dtype = getattr(ml_dtypes, note, None) if note.isidentifier() and not note.startswith("_") else None
    if not (isinstance(dtype, type) and issubclass(dtype, np.generic)) or np.dtype(dtype).itemsize != array.dtype.itemsize:
        raise ValueError(f"unknown dtype note {note!r} for an array of {array.dtype}")
    return array.view(dtype)
