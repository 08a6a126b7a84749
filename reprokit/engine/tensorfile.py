"""One file per engine call: every output tensor's raw bytes in one file, read memory-mapped.

An engine call's outputs cross the process boundary through the disk (``engine/worker.py``). A
survey pack of a 3,000-node model returns ~9,000 outputs; as one ``.npy`` each, opening them
(``np.load``: open, parse a header, map) cost more than comparing them (issue 39 item 4). Here the
worker appends each tensor to ONE file at a 64-byte aligned offset and lists name, offset, shape,
dtype and dtype note in its result.json; the parent maps that file once and hands out views of
it. Memory stays bounded: nothing is read until a view's pages are touched, and the writer holds
one tensor at a time. The captured activations (``engine/activations.py``) keep these files as
they come, one per capture run.

Owns the layout only: no engine, no judging. Dtypes .npy cannot name are stored as
``standalone/arrays.storable`` stores them (raw bits plus a note), strings as fixed-width unicode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from reprokit.files import read_json
from reprokit.standalone.arrays import load_npz, restored, save_npz, storable

ALIGN = 64  # every tensor starts on a cache line: views of any dtype are aligned


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in a tensor file."""

    offset: int
    shape: tuple[int, ...]
    dtype: str  # numpy's dtype string of the stored bytes (``storable``'s dtype)
    note: str = ""  # ``storable``'s dtype note (bfloat16, float8…, strings), empty for plain dtypes

    def to_json(self) -> dict:
        return {
            "offset": self.offset,
            "shape": list(self.shape),
            "dtype": self.dtype,
            **({"dtype_note": self.note} if self.note else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> Entry:
        return cls(
            int(data["offset"]),
            tuple(int(d) for d in data["shape"]),
            str(data["dtype"]),
            str(data.get("dtype_note") or ""),
        )


def write_tensors(path: str, tensors: Iterable[tuple[str, np.ndarray]]) -> dict[str, Entry]:
    """Append every (name, tensor) to the one file ``path``; returns name → Entry. Each tensor
    is taken from the iterable only when its turn comes and let go before the next (a backend
    whose outputs copy out of the engine on reading holds one copy at a time). Object arrays
    that are not strings are refused (ValueError), as ``np.save(allow_pickle=False)`` refuses them."""
    entries: dict[str, Entry] = {}
    offset = 0
    with open(path, "wb") as handle:
        for name, value in tensors:
            array, note = storable(np.asarray(value))
            if array.dtype.hasobject:
                raise ValueError(
                    f"output {name!r}: object arrays cannot be stored without pickling"
                )
            shape = tuple(array.shape)  # before ascontiguousarray, which makes a 0-d array 1-d
            array = np.ascontiguousarray(array)
            pad = -offset % ALIGN
            if pad:
                handle.write(b"\0" * pad)
                offset += pad
            entries[name] = Entry(offset, shape, array.dtype.str, note)
            if array.nbytes:
                handle.write(memoryview(array.reshape(-1)).cast("B"))
            offset += array.nbytes
            del value, array
        if offset == 0:
            handle.write(
                b"\0" * ALIGN
            )  # a file of empty tensors still maps (mmap refuses length 0)
    return entries


class TensorFile:
    """One tensor file, mapped once (on the first read) and shared by every view of it.
    ``stable``: the file stays as it is for the whole run (the captured activations), so a call
    may hand its views to a worker by reference (:func:`save_job_feeds`)."""

    def __init__(self, path: str, *, stable: bool = False):
        self.path = path
        self._map: np.memmap | None = None
        if stable:  # as np.memmap names its file (abspath) and as links resolve
            _STABLE.update((os.path.abspath(path), os.path.realpath(path)))

    def view(self, entry: Entry) -> np.ndarray:
        """The tensor at ``entry``, read-only, without reading its bytes yet."""
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype = np.dtype(entry.dtype)
        size = int(np.prod(entry.shape, dtype=np.int64)) * dtype.itemsize
        if entry.offset + size > self._map.size:
            raise ValueError(
                f"{self.path}: a tensor at {entry.offset}+{size} lies past the file's end"
            )
        array = self._map[entry.offset : entry.offset + size].view(dtype).reshape(entry.shape)
        return restored(array, entry.note or None)


class Tensors(Mapping):
    """name → tensor, every one a view of one tensor file (an engine call's outputs)."""

    def __init__(self, path: str, entries: dict[str, Entry]):
        self.file = TensorFile(path)
        self.entries = entries

    @property
    def path(self) -> str:
        return self.file.path

    def __getitem__(self, name: str) -> np.ndarray:
        return self.file.view(self.entries[name])

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


# Job feeds (``Oracle`` → ``engine/worker.py``): a packed call of a Swin feeds ~600 captured
# activations (~800 MB); copied into the call's .npz (with zip's CRC) they were ~2 s a run of
# reprokit's own time on a loaded machine. A feed that is a whole view of a stable tensor file
# goes by reference instead ((file, Entry) in a side file), and the worker copies it from there.
_STABLE: set[str] = set()
REFS_SUFFIX = ".refs.json"


def stable_key(value) -> tuple | None:
    """(file, byte offset, shape, dtype) of a C-contiguous numeric view of a stable tensor
    file's map — bytes that stay the same for the whole run — else None."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc" or not value.flags.c_contiguous:
        return None
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    filename = getattr(root, "filename", None)
    if not isinstance(root, np.memmap) or filename not in _STABLE:
        return None
    start = value.__array_interface__["data"][0] - root.__array_interface__["data"][0] + int(root.offset)
    if start < 0 or start + value.nbytes > root.nbytes + int(root.offset):
        return None
    return filename, start, tuple(value.shape), value.dtype.str


def stable_reference(value) -> dict | None:
    """(file, Entry) as JSON for a view :func:`stable_key` names, else None (any other array
    is written out as before)."""
    key = stable_key(value)
    if key is None or not os.path.isfile(key[0]):  # removed since (the run's end): copied as before
        return None
    filename, start, shape, dtype = key
    return {"file": os.path.realpath(filename), **Entry(start, shape, dtype).to_json()}


def save_job_feeds(path: str, feeds: dict) -> str:
    """The feeds of one engine call at ``path`` (an .npz), views of stable tensor files by
    reference beside it (``path`` + REFS_SUFFIX); read back by :func:`load_job_feeds`."""
    refs = {name: ref for name, value in feeds.items() if (ref := stable_reference(value)) is not None}
    save_npz(path, {name: value for name, value in feeds.items() if name not in refs})
    if refs:
        with open(path + REFS_SUFFIX, "w") as handle:
            json.dump({"order": list(feeds), "refs": refs}, handle)
    return path


def load_job_feeds(path: str) -> dict:
    """The feeds :func:`save_job_feeds` wrote (or a plain .npz), as writable arrays in their order."""
    feeds = load_npz(path)
    if not os.path.exists(path + REFS_SUFFIX):
        return feeds
    side = read_json(path + REFS_SUFFIX)
    files: dict[str, TensorFile] = {}
    for name, ref in side["refs"].items():
        file = files.setdefault(ref["file"], TensorFile(ref["file"]))
        feeds[name] = np.array(file.view(Entry.from_json(ref)))  # a copy, as load_npz gives
    return {name: feeds[name] for name in side["order"]}
