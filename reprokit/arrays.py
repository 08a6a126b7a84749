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
_STRING = "str"  # object arrays of Python strings (what onnxruntime returns for STRING tensors)


def save_npz(path: str, arrays: dict) -> str:
    """Write ``arrays`` (name → array) to ``path`` as an .npz; any name, any ONNX dtype."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            stored, note = storable(np.asarray(value))
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            if note:
                info.comment = _NOTE + note.encode()
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, stored, allow_pickle=False)
    return path


def load_npz(path: str) -> dict:
    """Read an .npz written by ``save_npz`` or ``np.savez``; dtypes noted by ``save_npz`` are
    restored. Raises ValueError for object arrays (pickles are never loaded)."""
    notes = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename.endswith(".npy") and info.comment.startswith(_NOTE):
                notes[info.filename[:-4]] = info.comment[len(_NOTE):].decode("ascii", "replace")
    with np.load(path, allow_pickle=False) as data:
        return {name: restored(np.array(data[name]), notes.get(name)) for name in data.files}


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
