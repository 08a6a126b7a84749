"""Content digests of feeds and files: the keys of the verdict cache and of a resumed run's
checks. Must not run engines.
"""

from __future__ import annotations

import hashlib

import numpy as np


def feeds_digest(feeds: dict) -> str:
    """A digest of the feeds' values: any ONNX dtype (ml_dtypes' bfloat16, float8, int4 …),
    strings by content, sequences (lists) element by element, empty optionals (None)."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        _digest_value(digest, name, feeds[name])
    return digest.hexdigest()


def _digest_value(digest, name: str, value) -> None:
    if value is None:
        digest.update(f"{name}|none|".encode())
        return
    if isinstance(value, (list, tuple)):
        digest.update(f"{name}|sequence {len(value)}|".encode())
        for index, item in enumerate(value):
            _digest_value(digest, f"{name}[{index}]", item)
        return
    array = np.ascontiguousarray(value)
    if array.dtype.kind == "O":  # strings (or bytes): by content, never by object address
        digest.update(f"{name}|object|{array.shape}|".encode())
        for item in array.flat:
            data = item if isinstance(item, bytes) else str(item).encode("utf-8", "surrogatepass")
            digest.update(f"{type(item).__name__}:{len(data)}:".encode() + data)
        return
    # numpy's own dtypes keep the header they always had (digests saved by --resume still match);
    # ml_dtypes' types say their name, their str ('<V2', '<i1') being ambiguous
    label = array.dtype.str if array.dtype.isbuiltin != 2 else f"{array.dtype.str}:{array.dtype.name}"
    digest.update(f"{name}|{label}|{array.shape}|".encode())
    digest.update(memoryview(array.reshape(-1).view(np.uint8)))


def file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
