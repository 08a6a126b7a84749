"""Redaction for models that cannot leave the company: generic node and tensor names, no doc
strings or metadata, and (optionally) weights replaced by seeded random values with the same
shape, mean and standard deviation. Whether random weights still reproduce is the caller's
check (report.py); this module only rewrites.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reprokit.graph.index import bodies

_SMALL = 16  # tensors this small (shapes, axes, scalars) are structure, never randomized


@dataclass
class Redaction:
    model: object
    feeds: dict
    names: dict[str, str]  # original tensor name -> generic name
    randomized: list[str] = field(default_factory=list)  # generic names of replaced weights


def redact(model, feeds: dict, *, randomize_weights: bool, seed: int = 0) -> Redaction:
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    rng = np.random.default_rng(seed)
    names: dict[str, str] = {}

    def rename(name: str, prefix: str) -> str:
        if not name:
            return name
        if name not in names:
            names[name] = f"{prefix}{len(names)}"
        return names[name]

    graph = model.graph
    for vi in graph.input:
        vi.name = rename(vi.name, "input_")
    for vi in graph.output:
        vi.name = rename(vi.name, "output_")
    randomized: list[str] = []
    for tensor in graph.initializer:
        tensor.name = rename(tensor.name, "weight_")
        array = numpy_helper.to_array(tensor)
        if randomize_weights and array.dtype.kind == "f" and array.size > _SMALL:
            replaced = _like(array, rng)
            tensor.CopyFrom(numpy_helper.from_array(replaced, tensor.name))
            randomized.append(tensor.name)
    _rename_graph(graph, rename, top=True)
    for vi in graph.value_info:
        vi.name = rename(vi.name, "t")
    del model.metadata_props[:]
    model.doc_string = ""
    model.producer_name = "reprokit-redacted"
    model.producer_version = ""
    model.domain = ""
    graph.name = "redacted"
    graph.doc_string = ""
    new_feeds = {names.get(k, k): v for k, v in feeds.items()}
    return Redaction(model, new_feeds, names, randomized)


def _rename_graph(graph, rename, top: bool = False) -> None:
    for index, node in enumerate(graph.node):
        node.name = f"node_{index}" if top else ""
        node.doc_string = ""
        for slot, name in enumerate(node.input):
            node.input[slot] = rename(name, "t")
        for slot, name in enumerate(node.output):
            node.output[slot] = rename(name, "t")
        for attr in node.attribute:
            attr.doc_string = ""
        for body in bodies(node):
            for vi in list(body.input) + list(body.output) + list(body.value_info):
                vi.name = rename(vi.name, "t")
            for tensor in body.initializer:
                tensor.name = rename(tensor.name, "weight_")
            body.name = "body"
            body.doc_string = ""
            _rename_graph(body, rename)


def _like(array: np.ndarray, rng) -> np.ndarray:
    """Random values with the same shape, mean and standard deviation."""
    mean = float(np.mean(array, dtype=np.float64))
    std = float(np.std(array, dtype=np.float64))
    return (rng.standard_normal(array.shape) * std + mean).astype(array.dtype)


# Text files of an archive that may quote this machine's paths (polygraphy's logs print the venv's
# polygraphy and the temporary stage folder, engines print their install paths).
_PUBLIC = {"", "/", "/usr", "/usr/local", "/opt", "/home", "/var"}
_BINARY = (".npz", ".onnx", ".bin", ".npy", ".data", ".pb", ".png", ".engine", ".plan")


def private_strings(stage: str, model_path: str | None = None) -> list[tuple[str, str]]:
    """(private text, stand-in) pairs, longest first: the stage folder, Python's install and
    virtual environment, the home folder, the working folder, the model's folder, the host name."""
    import os
    import socket
    import sys
    import tempfile

    def variants(path: str) -> set[str]:
        return {p.rstrip(os.sep) for p in (path, os.path.abspath(path), os.path.realpath(path)) if p}

    pairs: dict[str, str] = {}
    places = [(stage, "."), (sys.prefix, "<python>"), (sys.exec_prefix, "<python>"),
              (sys.base_prefix, "<python>"), (os.path.dirname(sys.executable), "<python>/bin"),
              (os.path.expanduser("~"), "<home>"), (os.getcwd(), "<cwd>"), (tempfile.gettempdir(), "<tmp>")]
    if model_path:
        places.append((os.path.dirname(os.path.abspath(model_path)), "<model-folder>"))
    for path, stand_in in places:
        for text in variants(path):
            if text not in _PUBLIC:  # system folders say nothing about anyone
                pairs.setdefault(text, stand_in)
    host = socket.gethostname()
    if len(host) >= 4:  # shorter names are words ("vm"), not secrets worth mangling every log for
        pairs.setdefault(host, "<host>")
    return sorted(pairs.items(), key=lambda pair: -len(pair[0]))


def scrub_tree(stage: str, pairs: list[tuple[str, str]]) -> list[str]:
    """Replace every private string in every text file under ``stage``; returns the files changed.
    Runs before the manifest is written, so the checksums are of the scrubbed files."""
    import os

    changed = []
    for root, _, files in os.walk(stage):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(_BINARY):
                continue
            with open(path, "rb") as handle:
                data = handle.read()
            if b"\0" in data:
                continue
            text = original = data.decode("utf-8", "replace")
            for private, stand_in in pairs:
                text = text.replace(private, stand_in)
            if text != original:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
                changed.append(os.path.relpath(path, stage))
    return changed
