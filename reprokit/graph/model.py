"""Load/save ONNX models (external data included), inspect inputs, freeze shapes, fold
constants, mark intermediate tensors as outputs. Must not run a backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from reprokit.errors import InputError, UsageError
from reprokit.spec import parse_target

_TWO_GB = 2_000_000_000


@dataclass(frozen=True)
class InputInfo:
    name: str
    dtype: np.dtype  # the element dtype (of each tensor, for a sequence or an optional)
    shape: tuple[int | str | None, ...]  # int for static dims, str/None for dynamic ones
    kind: str = "tensor"  # tensor, sequence, optional, optional-sequence (ONNX's value types); or map

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)


def load_model(path: str, *, load_weights: bool = True):
    """Read an ONNX file; every failure becomes an InputError that says what to do."""
    import onnx
    from google.protobuf.message import DecodeError

    if not os.path.exists(path):
        raise InputError(f"model file not found: {path}", hint="check the path")
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory, not an ONNX file", hint="pass the .onnx file")
    if os.path.getsize(path) == 0:
        raise InputError(f"model file is empty: {path}", hint="re-export the model")
    try:
        model = onnx.load(path, load_external_data=False)
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


def check_external_data(model, path: str) -> None:
    """Every external-data file must exist and be long enough for its tensors."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    base = os.path.dirname(os.path.abspath(path))
    for tensor in _all_tensors(model.graph):
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
    for tensor in _all_tensors(model.graph):
        if uses_external_data(tensor):
            found.add(ExternalDataInfo(tensor).location)
    return found


def weight_bytes(model) -> int:
    """Bytes of the model's weights, inline or external (from the external-data length fields;
    nothing is read)."""
    return sum(tensor_proto_bytes(tensor) for tensor in _all_tensors(model.graph))


def tensor_proto_bytes(tensor) -> int:
    """Bytes of one TensorProto's data, inline or external (nothing is read)."""
    import numpy as np
    from onnx import helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    if not uses_external_data(tensor):
        return tensor.ByteSize()
    info = ExternalDataInfo(tensor)
    if info.length:
        return int(info.length)
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except Exception:
        itemsize = 4
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _all_tensors(graph):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            for body in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                yield from _all_tensors(body)


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


def inline_external_data(model, base_dir: str):
    """Read the data of every external tensor the model still references into the proto.

    Read here rather than through onnx's loader: the run folder holds hard links to the user's
    weight files (no copies), which onnx's loader refuses as a possible link attack. Locations
    must stay inside ``base_dir``."""
    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    for tensor in _all_tensors(model.graph):
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
    large = model.ByteSize() > _TWO_GB if _byte_size_ok(model) else True
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


def staged_data(tmp: str, final: str) -> list[tuple[str, str]]:
    """The renames that finish a ``save_model(..., tmp, final_path=final)``: the model, and its
    data file when one was written."""
    renames = [(tmp, final)]
    if os.path.exists(tmp + ".data"):
        renames.append((tmp + ".data", final + ".data"))
    return renames


def _byte_size_ok(model) -> bool:
    try:
        model.ByteSize()
        return True
    except Exception:  # protobuf refuses to size messages over 2 GB
        return False


def input_infos(model) -> list[InputInfo]:
    """Real graph inputs (initializers listed as inputs excluded), with numpy dtypes."""
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    infos = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        kind, tensor = _value_kind(vi.type)
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else np.dtype("float32")
        except (KeyError, TypeError, ValueError):
            dtype = np.dtype("float32") if tensor.elem_type != 8 else np.dtype(object)
        dims = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or None)
        infos.append(InputInfo(vi.name, dtype, tuple(dims), kind))
    return infos


def _value_kind(type_proto):
    """(kind, TypeProto.Tensor of the elements) of a graph input's type: ``tensor``, ``sequence``
    (of tensors), ``optional`` (of a tensor), ``optional-sequence``; anything else is ``map``
    (and other types no feed format here carries)."""
    import onnx

    which = type_proto.WhichOneof("value")
    if which == "tensor_type" or which is None:
        return "tensor", type_proto.tensor_type
    if which == "sequence_type" and type_proto.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
        return "sequence", type_proto.sequence_type.elem_type.tensor_type
    if which == "optional_type":
        inner = type_proto.optional_type.elem_type
        if inner.WhichOneof("value") == "tensor_type":
            return "optional", inner.tensor_type
        if inner.WhichOneof("value") == "sequence_type" and inner.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
            return "optional-sequence", inner.sequence_type.elem_type.tensor_type
    return "map", onnx.TypeProto.Tensor()


def output_names(model) -> list[str]:
    return [o.name for o in model.graph.output]


def freeze_input_shapes(model, shapes: dict[str, tuple[int, ...]]):
    """Set the given input shapes (validated against the model) and infer shapes. Folding the
    constants this makes static runs onnxruntime: the caller folds, checked against the
    reference (:func:`reprokit.engine.folding.checked_fold`)."""
    infos = {i.name: i for i in input_infos(model)}
    for name, shape in shapes.items():
        if name not in infos:
            raise InputError(
                f"--input-shapes names {name!r}, which is not an input of the model",
                hint=f"model inputs: {', '.join(infos) or '(none)'}",
            )
        declared = infos[name].shape
        if declared and len(declared) != len(shape):
            raise InputError(
                f"shape {list(shape)} for {name!r} has rank {len(shape)}, the model declares "
                f"rank {len(declared)} ({_fmt(declared)})",
                hint=f"give {len(declared)} dimensions, e.g. {name}:{'x'.join('1' if not isinstance(d, int) else str(d) for d in declared)}",
            )
        for axis, (want, have) in enumerate(zip(shape, declared)):
            if isinstance(have, int) and have > 0 and have != want:
                raise InputError(
                    f"shape {list(shape)} for {name!r} contradicts the model's static dim {axis} = {have} ({_fmt(declared)})",
                    hint="only dynamic dimensions can be changed",
                )
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for dim, value in zip(dims, shapes[vi.name]):
                dim.Clear()
                dim.dim_value = int(value)
    try:
        import onnx

        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: engines infer shapes themselves
        return model


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"


def node_label(node, index: int) -> str:
    """The name reprokit shows and ``fp32-nodes=`` accepts for a node: its own name, or for an
    unnamed node ``OP_INDEX`` — its op type and its 0-based position among the top-level nodes
    of the file (``Pow_4``: the fifth node, an unnamed Pow)."""
    return node.name or f"{node.op_type}_{index}"


def name_unnamed_nodes(model) -> int:
    """Give every unnamed top-level node its :func:`node_label`, in place; returns how many."""
    named = 0
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = node_label(node, index)
            named += 1
    return named


def node_labels(model) -> set[str]:
    """Every name ``fp32-nodes=`` can use on this model: node names (subgraph bodies too) and
    the ``OP_INDEX`` labels of unnamed top-level nodes."""
    labels = {node_label(n, i) for i, n in enumerate(model.graph.node)}

    def bodies(graph):
        for node in graph.node:
            for attr in node.attribute:
                for body in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                    labels.update(n.name for n in body.node if n.name)
                    bodies(body)

    bodies(model.graph)
    return labels


def check_node_names(model, names, option: str = "fp32-nodes") -> None:
    """A UsageError (exit 2) when ``names`` holds a name that is no node of ``model``, with the
    closest names the model has."""
    import difflib

    labels = node_labels(model)
    unknown = [n for n in names if n not in labels]
    if not unknown:
        return
    close = []
    for name in unknown:
        close += [c for c in difflib.get_close_matches(name, labels, n=3, cutoff=0.5) if c not in close]
    shown = ", ".join(repr(n) for n in unknown[:5])
    raise UsageError(
        f"{option} names no node of the model: {shown}",
        hint=(f"did you mean {', '.join(close[:5])}? " if close else "")
        + "use the node names of the model file; an unnamed node is OP_INDEX (its op type and 0-based "
          "position in the file, e.g. Pow_4), as the layerwise table and audit show them")


def check_target_nodes(model, target: str) -> None:
    """Usage error before any work when the target's ``fp32-nodes=`` names no node of ``model``
    (a ModelProto or the path of the user's file, where ``OP_INDEX`` labels are counted; the
    file is read, without weights, only when the target has ``fp32-nodes``)."""
    spec = parse_target(target)
    if not spec.has("fp32-nodes"):
        return
    names = [n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip()]
    if isinstance(model, (str, os.PathLike)):
        model = load_model(os.fspath(model), load_weights=False)
    check_node_names(model, names)


def tensor_order(model) -> list[tuple[str, str, str]]:
    """(tensor, producing node name, op type) for every node output, in graph (topological) order."""
    out = []
    for index, node in enumerate(model.graph.node):
        name = node_label(node, index)
        out.extend((t, name, node.op_type) for t in node.output if t)
    return out


_INFERRED: list = []  # (model, value_info) of the last few models: inference is costly on big graphs


def inferred_value_info(model) -> dict:
    """Types and shapes of every tensor shape inference knows (graph outputs included), for a
    model object; remembered for the last few models, which must not be changed afterwards."""
    import onnx

    for seen, value_info in _INFERRED:
        if seen is model:
            return value_info
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # best effort: unknown tensors simply have no type here
        inferred = model
    value_info = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    _INFERRED.insert(0, (model, value_info))
    del _INFERRED[4:]
    return value_info


def float_tensor_names(model) -> set[str]:
    """Names of node outputs whose inferred type is a float type."""
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    return {name for name, vi in inferred_value_info(model).items() if vi.type.tensor_type.elem_type in floats}


def mark_outputs(model, names: list[str]):
    """Copy of the model with ``names`` added as graph outputs (types from shape inference)."""
    import onnx
    from onnx import helper

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    known = inferred_value_info(model)
    existing = {o.name for o in marked.graph.output}
    for name in names:
        if name in existing:
            continue
        if name in known:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(known[name])
        else:
            vi = helper.make_empty_tensor_value_info(name)
        marked.graph.output.append(vi)
        existing.add(name)
    return marked
