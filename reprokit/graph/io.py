"""Model files: load an ONNX file (every failure an InputError that says what to do), save one
atomically (over 2 GB: weights as external data beside it), and the weights that live outside it
(external data: check, locate, stage for engines, inline). Whether a loaded graph is valid is
``graph/validity.py``'s. Must not change a graph or run a backend.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from reprokit.errors import InputError
from reprokit.graph.tensors import all_tensors

# protobuf cannot serialize a message over 2 GiB: a bigger model keeps its weights in a .data file.
# REPROKIT_LARGE_MODEL_BYTES lowers the line for tests (the same code path on a small model).
_TWO_GB = int(os.environ.get("REPROKIT_LARGE_MODEL_BYTES") or 2_000_000_000)



def load_model(path: str, *, load_weights: bool = True):
    """Read an ONNX file; every failure becomes an InputError that says what to do."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.exists(path):
        raise InputError(f"model file not found: {path}", hint="check the path")
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory, not an ONNX file", hint="pass the .onnx file")
    if not os.path.isfile(path):  # a FIFO, /dev/zero: reading would block or never end
        raise InputError(f"{path} is not a regular file", hint="pass the .onnx file itself")
    if os.path.getsize(path) == 0:
        raise InputError(f"model file is empty: {path}", hint="re-export the model")
    try:
        model = _take_parsed(path) or onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as exc:
        raise InputError(
            f"cannot read {path} as an ONNX model ({exc.__class__.__name__}: {str(exc)[:200]})",
            hint="the file is truncated or not ONNX; re-export it or check `polygraphy inspect model`",
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise InputError(
            f"{path} parsed as ONNX but holds no graph (random bytes or another format?)",
            hint="re-export the model",
        )
    check_external_data(model, path)
    _remember_outline(path, model)
    if load_weights and not external_locations(model):
        return model
    if load_weights:
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
        except Exception as exc:  # onnx raises a mix of types for bad external data
            raise InputError(f"cannot load external data of {path}: {exc}",
                             hint="keep the weight files next to the model, as exported") from exc
    return model


@dataclass(frozen=True)
class FileOutline:
    """What later readers of a model file need of it, kept when it is first parsed: a Swin's
    110 MB were parsed five times a run (0.2-0.3 s each on a loaded machine) for its external
    data files (the files a command reads, --resume's weights digest) and its node list (the
    drift window's anchor in the user's file)."""

    locations: frozenset[str]  # external data files, as the model names them
    nodes: tuple[NodeStub, ...]  # its top-level nodes in file order (for graph.model.node_label)


@dataclass(frozen=True)
class NodeStub:
    name: str
    op_type: str


_OUTLINES: dict[tuple, FileOutline] = {}
_OUTLINES_KEPT = 8  # a run reads a handful of model files; the outlines are small


def _file_identity(path: str) -> tuple:
    """The file as it is now: a file rewritten since (size, mtime or inode changed) is another."""
    stat = os.stat(path)
    return os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino


def _remember_outline(path: str, model) -> None:
    if len(_OUTLINES) >= _OUTLINES_KEPT:
        _OUTLINES.pop(next(iter(_OUTLINES)))
    _OUTLINES[_file_identity(path)] = FileOutline(
        frozenset(external_locations(model)), tuple(NodeStub(n.name, n.op_type) for n in model.graph.node))


def file_outline(path: str) -> FileOutline:
    """The outline of the model file at ``path``, parsed only when no load of this very file
    (same size, mtime and inode) in this process kept one; load_model's errors otherwise."""
    if os.path.isfile(path):
        found = _OUTLINES.get(_file_identity(path))
        if found is not None:
            return found
    model = load_model(path, load_weights=False)
    identity = _file_identity(path)
    _PARSED.clear()  # one slot: the file read last
    _PARSED[identity] = model
    return _OUTLINES[identity]


# The proto file_outline parsed, kept for the next load_model of that very file, which takes it
# (nobody else sees it): a command lists the files it reads (cli/options.files_read) right before
# it loads the model, and a Swin's parse is 0.3-0.5 s on a loaded machine.
_PARSED: dict[tuple, object] = {}


def _take_parsed(path: str):
    if not _PARSED:
        return None
    return _PARSED.pop(_file_identity(path), None)


def check_external_data(model, path: str) -> None:
    """Every external-data file must exist and be long enough for its tensors."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    base = os.path.dirname(os.path.abspath(path))
    for tensor in all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        location = external_data_path(base, info.location, tensor.name)
        if not os.path.exists(location):
            raise InputError(
                f"external data file {info.location!r} of tensor {tensor.name!r} is missing "
                f"(looked in {base})",
                hint="copy the weight files next to the .onnx file, as they were exported",
            )
        needed = (info.offset or 0) + (info.length or 0)
        if info.length and os.path.getsize(location) < needed:
            raise InputError(
                f"external data file {info.location!r} is truncated: tensor {tensor.name!r} needs "
                f"{needed} bytes, the file has {os.path.getsize(location)}",
                hint="the weight file is incomplete; copy it again",
            )


def external_data_path(base_dir: str, location: str, tensor_name: str) -> str:
    """The file an external tensor's ``location`` names, which must really lie inside
    ``base_dir``: no absolute path, no '..', and no link leading out, because the weights are
    read into minimal.onnx and shipped in reports (a weight file linked to ~/.ssh/id_rsa would
    be). Hard links are files of their own and stay allowed."""
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise InputError(f"external data location {location!r} of tensor {tensor_name!r} leaves the model folder",
                         hint="keep the weight files next to the model, as exported")
    path = os.path.join(base_dir, location)
    root = os.path.realpath(base_dir)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise InputError(
            f"external data file {location!r} of tensor {tensor_name!r} resolves outside the model folder "
            f"{base_dir} (to {real})",
            hint="copy the weight file next to the model instead of linking it: links that lead out of "
                 "the model folder are not followed, as their target would be read and shipped in reports")
    return path


def external_locations(model) -> set[str]:
    """Files that the model's not-yet-loaded external tensors live in (relative paths)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    found = set()
    for tensor in all_tensors(model):
        if uses_external_data(tensor):
            found.add(ExternalDataInfo(tensor).location)
    return found


def weight_bytes(model) -> int:
    """Bytes of the model's weights, inline or external (from the external-data length fields;
    nothing is read)."""
    return sum(tensor_proto_bytes(tensor) for tensor in all_tensors(model))


def tensor_proto_bytes(tensor) -> int:
    """Bytes of one TensorProto's data, inline or external (nothing is read). Called for every
    weight of every pack member (``shrink/members.member_cost``): ~30,000 times a Swin run, so
    the inline case stays a few dict and attribute reads."""
    if tensor.data_location != _EXTERNAL:  # onnx's uses_external_data, without its import per call
        size = _fixed_size(tensor)  # from the dims: sizing the message walks it (3 ms for 9 MB)
        return tensor.ByteSize() if size is None else size
    from onnx import helper
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    if info.length:
        return int(info.length)
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:
        itemsize = 4
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _fixed_size(tensor) -> int | None:
    """Bytes of an inline tensor's ``raw_data`` from its dims and type, without touching them
    (None for strings, sub-byte types or data in typed fields: those are sized as a message)."""
    itemsize = _ITEM_BYTES.get(tensor.data_type)
    if itemsize is None or not tensor.HasField("raw_data"):
        return None
    return math.prod(tensor.dims) * itemsize  # math.prod: np.prod's call costs 5 us, 30,000 times a run


_EXTERNAL = 1  # TensorProto.EXTERNAL (onnx imported lazily)
# TensorProto.DataType -> bytes per element, for the types stored a whole number of bytes each
# (float, uint8, int8, uint16, int16, int32, int64, bool, float16, double, uint32, uint64,
# complex64, complex128, bfloat16, and the float8s)
_ITEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
               17: 1, 18: 1, 19: 1, 20: 1, 24: 1}


def stage_external_data(model, src_dir: str, dst_dir: str) -> None:
    """Make the model's external data files in ``src_dir`` appear in ``dst_dir``, for engines
    that read weights only from the model file's own folder and refuse links that resolve
    elsewhere (OpenVINO, TensorRT's parser): a hard link where the file system allows, else a
    copy. Callers remove ``dst_dir`` right after the engine call, because a hard link raises
    the link count of the user's weight file and onnx refuses to load such a file meanwhile."""
    import shutil

    if os.path.abspath(src_dir) == os.path.abspath(dst_dir):
        return
    for location in external_locations(model):
        src = os.path.join(src_dir, location)
        dst = os.path.join(dst_dir, location)
        if os.path.lexists(dst) or not os.path.exists(src):
            continue
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)


def weights_apart(model, path: str, *, min_bytes: int = 1024, align: int = 4096):
    """A copy of ``model`` whose inline top-level weights (``raw_data`` of ``min_bytes`` or more)
    are external data in ``path``, written here once; the copy references them by ``path``'s
    base name, so a model file saved in the same folder finds them. Copies of that graph that
    give one weight several names (:func:`reprokit.graph.pack.model_copies`' private weights)
    then reference the same bytes: no weight is serialized, written or parsed once per copy.
    Offsets are aligned to ``align`` bytes (onnxruntime maps aligned external data)."""
    import onnx
    from onnx import TensorProto

    light = onnx.ModelProto()
    light.CopyFrom(model)
    location, offset = os.path.basename(path), 0
    with open(path, "wb") as handle:
        for init in light.graph.initializer:
            if init.data_location == TensorProto.EXTERNAL or len(init.raw_data) < min_bytes:
                continue
            data = init.raw_data
            pad = (-offset) % align
            handle.write(b"\0" * pad)
            offset += pad
            handle.write(data)
            init.ClearField("raw_data")
            init.data_location = TensorProto.EXTERNAL
            del init.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(data)))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            offset += len(data)
    return light


def inline_external_data(model, base_dir: str):
    """Read the data of every external tensor the model still references into the proto.

    Read here rather than through onnx's loader: the run folder holds hard links to the user's
    weight files (no copies), which onnx's loader refuses as a possible link attack. Locations
    must stay inside ``base_dir``."""
    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    for tensor in all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = ExternalDataInfo(tensor)
        path = external_data_path(base_dir, info.location, tensor.name)
        with open(path, "rb") as handle:
            handle.seek(info.offset or 0)
            data = handle.read(info.length) if info.length else handle.read()
        tensor.raw_data = data
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    return model


def save_model(model, path: str, *, base_dir: str | None = None, self_contained: bool = False,
               final_path: str | None = None) -> str:
    """Save atomically. A model whose weights are still on disk (external data, not loaded)
    keeps referencing them by relative location; engines are told where they are (the
    ``weights_dir`` of a worker call). ``self_contained`` reads them from ``base_dir`` into the
    file instead (small results that travel). Over 2 GB of inline data, the weights go to
    ``<final name>.data`` beside the file, written whole under a temporary name and renamed
    (onnx appends to an existing data file, so it never sees one), and a stale one from an
    earlier large save is removed when the model no longer needs it.

    ``final_path``: ``path`` is a staging name the caller renames to ``final_path`` later (with
    ``path + ".data"`` to ``final_path + ".data"``, see :func:`staged_data`); the model then
    already references the data file by its final name."""
    import shutil
    import tempfile

    import onnx

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    if self_contained and base_dir and external_locations(model):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        inline_external_data(model, base_dir)
    large = not fits_inline(model)
    data_name = os.path.basename(final_path or path) + ".data"
    data_path = path + ".data" if final_path else os.path.join(folder, data_name)
    if not large:
        tmp = path + ".tmp"
        onnx.save(model, tmp)
        os.replace(tmp, path)
        if final_path is None and os.path.exists(data_path):
            os.remove(data_path)  # a previous, larger model's weights: nothing references them now
        return path
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx's external-data writer empties the tensors of what it saves
    scratch = tempfile.mkdtemp(prefix=".saving-", dir=folder)
    try:
        onnx.save(copy, os.path.join(scratch, "model.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=data_name)
        written = os.path.join(scratch, data_name)
        if os.path.exists(written):  # onnx keeps tensors under 1 KiB inline: maybe no data at all
            os.replace(written, data_path)
        elif os.path.exists(data_path):
            os.remove(data_path)
        os.replace(os.path.join(scratch, "model.onnx"), path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def fits_inline(model) -> bool:
    """Does :func:`save_model` write ``model`` as one file (under protobuf's 2 GB line), not
    with its weights in a ``.data`` file beside it?"""
    # sizing the message walks every weight: only near the limit (the weights' bytes come from dims)
    return not (weight_bytes(model) > _TWO_GB - (256 << 20) and _byte_size(model) > _TWO_GB)


def staged_data(tmp: str, final: str) -> list[tuple[str, str]]:
    """The renames that finish a ``save_model(..., tmp, final_path=final)``: the model, and its
    data file when one was written."""
    renames = [(tmp, final)]
    if os.path.exists(tmp + ".data"):
        renames.append((tmp + ".data", final + ".data"))
    return renames


def _byte_size(model) -> int:
    try:
        return model.ByteSize()
    except Exception:  # protobuf refuses to size messages over 2 GB
        return _TWO_GB + 1
