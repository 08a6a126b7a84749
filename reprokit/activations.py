"""On-disk store of captured tensors: one .npy per tensor plus an index, read memory-mapped.

Must not hold everything in RAM: ``get`` returns a read-only memory map.
"""

from __future__ import annotations

import json
import os

import numpy as np


class ActivationStore:
    """Tensors captured from one reference run, by tensor name."""

    INDEX = "index.json"

    def __init__(self, directory: str, files: dict[str, str]):
        self.directory = directory
        self._files = files
        self._meta: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    @classmethod
    def from_worker(cls, job_dir: str, outputs: dict[str, np.ndarray]) -> ActivationStore:
        """Adopt the .npy files a worker wrote (no copy); write the index for resume."""
        with open(os.path.join(job_dir, "result.json")) as handle:
            entries = json.load(handle)["outputs"]
        files = {e["name"]: e["file"] for e in entries}
        store = cls(job_dir, files)
        with open(os.path.join(job_dir, cls.INDEX), "w") as handle:
            json.dump(files, handle)
        return store

    @classmethod
    def open(cls, directory: str) -> ActivationStore:
        with open(os.path.join(directory, cls.INDEX)) as handle:
            return cls(directory, json.load(handle))

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def names(self) -> list[str]:
        return list(self._files)

    def get(self, name: str) -> np.ndarray:
        return np.load(os.path.join(self.directory, self._files[name]), mmap_mode="r", allow_pickle=False)

    def info(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype without reading the data."""
        if name not in self._meta:
            array = self.get(name)
            self._meta[name] = (tuple(array.shape), array.dtype)
        return self._meta[name]

    def disk_bytes(self) -> int:
        return sum(os.path.getsize(os.path.join(self.directory, f)) for f in self._files.values())
