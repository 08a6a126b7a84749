"""On-disk store of captured tensors: one tensor file per capture run (``engine/tensorfile.py``,
kept as the worker wrote it) plus an index, read memory-mapped. Stores written before the tensor
files (one .npy per tensor, index values ``"a000001.npy#bfloat16"``) still open.

Must not hold everything in RAM: ``get`` returns a read-only view of a memory map, each file
mapped once.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from reprokit.engine.tensorfile import Entry, TensorFile
from reprokit.engine.worker import load_npy
from reprokit.errors import InputError
from reprokit.files import read_json
from reprokit.graph.controlflow import open_control_flow
from reprokit.graph.index import inferred_value_info


class ActivationStore:
    """Tensors captured from one reference run, by tensor name."""

    INDEX = "index.json"

    def __init__(self, directory: str, files: dict[str, str | list]):
        self.directory = directory
        # name -> [tensor file, Entry as JSON]; or, from an older store, "a000001.npy[#note]"
        self._files = files
        self._meta: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self._maps: dict[str, TensorFile] = {}
        self._entries: dict[str, tuple[str, Entry]] = {}

    @classmethod
    def capture(cls, run_chunk, names: list[str], sizes: dict[str, int], directory: str, *,
                chunk_bytes: int, max_disk_bytes: int | None = None, on_event=None) -> ActivationStore:
        """Capture ``names`` by as many reference runs as it takes to keep each run's marked
        outputs under ``chunk_bytes`` (estimated from static shapes), moving each run's tensor
        file into ``directory``. Stops with a clear error before, or as soon as, the files
        would pass ``max_disk_bytes`` or the free disk space."""
        estimate = sum(sizes.get(n, 0) for n in names)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(directory)) or ".").free
        if max_disk_bytes is not None and estimate > max_disk_bytes:
            raise InputError(
                f"capturing the reference activations needs about {_mib(estimate)} on disk, more than "
                f"--max-activation-disk {_mib(max_disk_bytes)}",
                hint="raise --max-activation-disk, or cut the model first (--input-shapes with a smaller batch)")
        if estimate > free:
            raise InputError(f"capturing the reference activations needs about {_mib(estimate)}; "
                             f"only {_mib(free)} are free under {directory}",
                             hint="free disk space or put -o on a larger disk")
        chunks, current, total = [], [], 0
        for name in names:
            size = sizes.get(name, 0)
            if current and total + size > chunk_bytes:
                chunks.append(current)
                current, total = [], 0
            current.append(name)
            total += size
        if current:
            chunks.append(current)
        if os.path.exists(directory):
            shutil.rmtree(directory)
        os.makedirs(directory)
        files: dict[str, list] = {}
        used = 0
        for number, chunk in enumerate(chunks):
            if on_event and len(chunks) > 1:
                on_event(f"capturing activations, part {number + 1} of {len(chunks)} ({len(chunk)} tensors)")
            result = run_chunk(chunk)
            if result.outputs:  # one tensor file per run, kept as the worker wrote it
                file = f"c{number:04d}.bin"
                os.replace(result.outputs.path, os.path.join(directory, file))
                files.update((name, [file, entry.to_json()]) for name, entry in result.outputs.entries.items())
                used += os.path.getsize(os.path.join(directory, file))
            result.discard()
            if max_disk_bytes is not None and used > max_disk_bytes:
                raise InputError(f"the captured activations passed --max-activation-disk {_mib(max_disk_bytes)}",
                                 hint="raise --max-activation-disk, or shrink a smaller input (--input-shapes)")
        # The index vouches for the capture (--resume reuses it): written whole or not at all.
        index = os.path.join(directory, cls.INDEX)
        try:
            with open(index + ".tmp", "w") as handle:
                json.dump(files, handle)
            os.replace(index + ".tmp", index)
        except BaseException:
            if os.path.exists(index + ".tmp"):
                os.remove(index + ".tmp")
            raise
        return cls(directory, files)

    @classmethod
    def open(cls, directory: str) -> ActivationStore:
        return cls(directory, read_json(os.path.join(directory, cls.INDEX)))

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def __getitem__(self, name: str) -> np.ndarray:
        return self.get(name)

    def get(self, name: str) -> np.ndarray:
        where = self._entries.get(name)
        if where is None:
            value = self._files[name]
            if isinstance(value, str):  # an older store: one .npy per tensor
                file, _, dtype = value.partition("#")
                return load_npy(os.path.join(self.directory, file), dtype or None)
            where = self._entries[name] = (value[0], Entry.from_json(value[1]))
        file, entry = where
        if file not in self._maps:
            self._maps[file] = TensorFile(os.path.join(self.directory, file), stable=True)  # written once
        return self._maps[file].view(entry)

    def nbytes(self) -> int:
        """Bytes of every captured tensor together (the files' sizes; nothing is read)."""
        files = {v.partition("#")[0] if isinstance(v, str) else v[0] for v in self._files.values()}
        return sum(os.path.getsize(os.path.join(self.directory, file)) for file in files)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype without reading the data."""
        if name not in self._meta:
            array = self.get(name)  # a view: nothing of the data is read
            self._meta[name] = (tuple(array.shape), array.dtype)
        return self._meta[name]


def _mib(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB" if value < 2**30 else f"{value / 2**30:,.2f} GiB"


class CheckCapture:
    """A reference run that marked every node output of the model it checked (the fold's check
    run: ``engine/folding.checked_fold``), its tensor file kept: a capture of the same tensors on
    the same feeds in one run takes it (:meth:`take`) instead of running the reference again.
    Whoever holds one discards it when no capture took it."""

    def __init__(self, result, names: frozenset, feeds: dict):
        self.result, self.names, self.feeds = result, names, feeds

    def take(self, chunk: list[str], feeds: dict):
        """The run's WorkerResult when it holds exactly ``chunk`` of the very ``feeds`` (the
        input sample the capture runs on: several samples may have moved it), once; else None."""
        result = self.result
        if result is None or feeds is not self.feeds or set(chunk) != self.names or set(result.outputs) != self.names:
            return None
        self.result = None
        return result

    def discard(self) -> None:
        if self.result is not None:
            self.result.discard()
            self.result = None


def tensor_bytes(value_info) -> int:
    """Bytes of a tensor from its inferred type and static shape; 0 when unknown."""
    from onnx import helper

    tensor = value_info.type.tensor_type
    if not tensor.elem_type:
        return 0
    count = 1
    for dim in tensor.shape.dim:
        if not dim.HasField("dim_value"):
            return 0
        count *= dim.dim_value
    return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize


def capture_opened(model, feeds: dict, run_reference, directory: str, chunk_bytes: int):
    """Every tensor of ``model`` the reference computes on ``feeds``, those inside the If
    branches it takes included, on disk: the model opened (If nodes inlined, small Loops
    unrolled; names kept where they do not clash) and every node output of that marked.
    ``run_reference(model, names)`` runs the reference and returns its result."""
    index = os.path.join(directory, ActivationStore.INDEX)
    if os.path.exists(index):
        return ActivationStore.open(directory)

    def values(current, names):
        result = run_reference(current, names)
        try:
            return {n: np.array(v) for n, v in dict(result.outputs).items()}
        finally:
            result.discard()

    levels = open_control_flow(model, values)
    opened = levels[-1][0] if levels else model
    names = list(dict.fromkeys(o for n in opened.graph.node for o in n.output if o))
    known = inferred_value_info(opened)
    sizes = {n: tensor_bytes(known[n]) for n in names if n in known}
    return ActivationStore.capture(lambda chunk: run_reference(opened, chunk), names, sizes, directory,
                                   chunk_bytes=chunk_bytes)
