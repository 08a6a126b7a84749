"""OpenVINO CPU backend with an inference precision hint (bf16, f16 or f32).

On CPUs with AVX512-BF16 OpenVINO's default CPU precision is bf16, so real models really diverge
here: a true optimizing engine with layer fusion, standing in for TensorRT on a machine with no GPU.
OpenVINO renames, merges and drops tensors while it reads a model, so inputs and outputs are
matched to its ports through the ONNX graph (by position and by every name a port carries), never
through the one name OpenVINO happens to report.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping

import numpy as np

from reprokit.engine.backends.base import (
    Availability,
    Backend,
    BuildError,
    RunResult,
    module_version,
)
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.graph.model import check_node_names, name_unnamed_nodes
from reprokit.spec import OptionDoc, TargetSpec

_HINTS = {"bf16": "bf16", "f16": "f16", "f32": "f32"}


def cpu_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


class OpenVinoBackend(Backend):
    engine = "openvino"
    summary = "OpenVINO on the CPU with an inference precision hint (default bf16)"
    OPTIONS = {
        "bf16": OptionDoc("inference precision bf16 (needs a CPU with BF16 support; the default)"),
        "f16": OptionDoc("inference precision f16 (needs a CPU with FP16 support)"),
        "f32": OptionDoc("inference precision f32"),
        "fp32-nodes": OptionDoc("with bf16/f16: keep these ONNX nodes' operations in f32 (marked precise), "
                                "';'-separated (fp32-nodes=a;b)", "str"),
    }
    deterministic = True
    install_hint = "pip install 'reprokit[openvino]'  (or: pip install openvino)"
    marking_changes_engine = True

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        if sum(spec.has(h) for h in _HINTS) > 1:
            raise UsageError("openvino takes one precision: bf16, f16 or f32", hint="e.g. openvino:bf16")
        if spec.has("fp32-nodes"):
            if not [n for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip()]:
                raise UsageError("openvino fp32-nodes names no node", hint="e.g. openvino:bf16,fp32-nodes=/ln/Add;/ln/Mul")
            if spec.has("f32"):
                raise UsageError("openvino fp32-nodes only matters with bf16 or f16: f32 computes in f32 already",
                                 hint="e.g. --target openvino:bf16,fp32-nodes=NODE")

    def hint(self) -> str:
        return next((h for h in _HINTS if self.spec.has(h)), "bf16")

    def precision(self) -> str:
        return {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}[self.hint()]

    @classmethod
    def probe(cls) -> Availability:
        found = module_version("openvino")
        if not found.available:
            return Availability(False, None, f"{found.detail}; install: {cls.install_hint}")
        caps = cpu_capabilities()
        usable = [name for name, cap in (("f32", "FP32"), ("bf16", "BF16"), ("f16", "FP16")) if cap in caps]
        missing = [name for name in ("bf16", "f16") if name not in usable]
        text = f"precisions here: {', '.join(usable) or 'none'}"
        if missing:
            text += f" ({', '.join('openvino:' + m for m in missing)} refused: this CPU lacks the capability"
            text += "; plain `openvino` means bf16)" if "bf16" in missing else ")"
        return Availability(True, found.version, f"{text}; CPU capabilities: {', '.join(caps)}")

    def run(self, model_path, feeds, output_names):
        self.refuse_containers(feeds)
        try:
            import openvino as ov
        except ImportError as exc:
            raise EngineUnavailable(f"OpenVINO is not installed: {exc}", hint=self.install_hint) from exc
        core = ov.Core()
        hint = self.hint()
        caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        wanted_cap = {"bf16": "BF16", "f16": "FP16", "f32": "FP32"}[hint]
        if wanted_cap not in caps:
            raise EngineUnavailable(
                f"this CPU cannot run OpenVINO in {hint} (OPTIMIZATION_CAPABILITIES: {', '.join(caps)}); "
                "OpenVINO would silently fall back to f32",
                hint="use --target openvino:f32, or emulate:bf16 / emulate:fp16 which work on any CPU",
            )
        graph_inputs, graph_outputs = onnx_io_names(model_path)
        try:
            model = core.read_model(model_path)
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses with its own text
            raise BuildError(f"OpenVINO failed to read the model: {engine_reason(exc)}\n{exc}") from exc
        bound = bind_inputs(model.inputs, graph_inputs, feeds)
        reshape_to_feeds(model, bound)
        keep = [n.strip() for n in str(self.spec.get("fp32-nodes", "")).split(";") if n.strip()]
        meta: dict = {}
        config = {"INFERENCE_PRECISION_HINT": hint}
        with tempfile.TemporaryDirectory(prefix="reprokit-openvino-") as tmp:
            if keep:
                model, marked = keep_precise(core, model, model_path, keep, tmp)
                meta["fp32_nodes"] = keep
            try:
                compiled = core.compile_model(model, "CPU", config)
                if keep and narrow_ops(compiled, marked):
                    # The CPU plugin's snippets fuse ops into subgraphs that run in the hint's
                    # precision whatever their marks say: with them off, the marks hold.
                    config["SNIPPETS_MODE"] = "DISABLE"
                    compiled = core.compile_model(model, "CPU", config)
                    meta["snippets"] = "disabled: the CPU plugin's snippets would fuse marked nodes into bf16/f16 code"
            except Exception as exc:
                raise BuildError(f"OpenVINO failed to compile the model: {engine_reason(exc)}\n{exc}") from exc
            if keep:
                meta["fp32_nodes_not_kept"] = sorted({marked[n] for n in narrow_ops(compiled, marked)})
        ports = output_ports([set(p.get_names()) for p in compiled.outputs], graph_outputs,
                             output_names or graph_outputs)
        missing = [n for n, index in ports.items() if index is None]
        if missing:
            raise BuildError(f"OpenVINO dropped outputs {missing[:5]} while compiling")
        try:
            request = compiled.create_infer_request()
            # Zero-copy both ways: the worker's feeds are the inputs, and each output is copied
            # only when the worker saves it (a pack's feeds and outputs would otherwise be held
            # twice or three times at the peak, hundreds of MiB on a PP-OCR survey pack).
            request.infer({index: to_tensor(array) for index, array in bound.items()},
                          share_inputs=True, share_outputs=True)
            outputs = RequestOutputs(request, ports)
        except Exception as exc:
            raise BuildError(f"OpenVINO failed to run the model: {engine_reason(exc)}\n{exc}") from exc
        actual = compiled.get_property("INFERENCE_PRECISION_HINT")
        name = actual.get_type_name() if hasattr(actual, "get_type_name") else str(actual)
        meta["int8_ops"] = int8_ops(compiled)  # a Q/DQ model: did the low-precision path run at all?
        return RunResult(outputs=outputs, meta={"inference_precision": name, "device": "CPU", **meta})


def keep_precise(core, model, model_path: str, keep: list[str], tmp: str):
    """``model`` with the operations of the ONNX nodes ``keep`` marked precise (OpenVINO's
    ``DisableFP16Compression`` runtime attribute: the CPU plugin leaves such operations in f32
    under a bf16/f16 hint). Python cannot create that attribute, so it travels through the IR,
    whose reader makes it from ``<attribute name="precise" version="0"/>``. An ONNX node may
    become several operations: every operation between the node's output ports and its inputs
    is marked. Returns (the marked model, marked operation name -> ONNX node)."""
    import xml.etree.ElementTree as ElementTree

    import onnx
    import openvino as ov

    graph = onnx.load(model_path, load_external_data=False)
    name_unnamed_nodes(graph)
    check_node_names(graph, keep)
    nodes = {n.name: n for n in graph.graph.node}
    onnx_tensors = {t for n in graph.graph.node for t in n.output if t}
    by_tensor = {}
    for op in model.get_ops():
        for port in op.outputs():
            for name in port.get_names():
                by_tensor.setdefault(name, op)
    marked: dict[str, str] = {}
    for label in keep:
        node = nodes.get(label)
        if node is None:  # a node inside an If/Loop body: its operations carry no name to find
            continue
        # another ONNX node's tensor (this node's inputs, or any name OpenVINO kept) ends the walk
        stop = onnx_tensors - set(node.output)
        todo = [by_tensor[t] for t in node.output if t in by_tensor]
        seen = set()
        while todo:
            op = todo.pop()
            if id(op) in seen or op.get_type_name() in ("Parameter", "Constant", "Result"):
                continue
            seen.add(id(op))
            fresh = f"reprokit_precise_{len(marked)}"
            op.set_friendly_name(fresh)
            marked[fresh] = label
            for source in op.input_values():
                if not (set(source.get_names()) & stop):
                    todo.append(source.get_node())
    xml, weights = f"{tmp}/marked.xml", f"{tmp}/marked.bin"
    ov.save_model(model, xml, compress_to_fp16=False)
    tree = ElementTree.parse(xml)
    for layer in tree.getroot().iter("layer"):
        if layer.get("name") in marked:
            info = layer.find("rt_info")
            if info is None:
                info = ElementTree.SubElement(layer, "rt_info")
            ElementTree.SubElement(info, "attribute", {"name": "precise", "version": "0"})
    tree.write(xml)
    return core.read_model(xml, weights), marked


def int8_ops(compiled) -> int:
    """Operations the compiled model runs in i8/u8 or f8 (its low-precision transformations turned
    Q/DQ pairs into integer or FP8 kernels); 0 when every op runs in float, whatever the model's
    Q/DQ say. An FP8 Q/DQ model on the CPU (2026.4) keeps only f8 constants and Converts to and
    from f8 (rounding, computed in float): those are no FP8 kernel."""
    count = 0
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
        kind = info["layerType"].astype(str) if "layerType" in info else ""
        if precision in ("f8e4m3", "f8e5m2") and kind not in ("Convert", "Const", "Reorder"):
            count += 1
        elif precision in ("i8", "u8"):
            count += 1
    return count


def narrow_ops(compiled, marked: dict) -> list[str]:
    """The marked operations the compiled model may not run in f32: in an operation that runs
    in bf16/f16, or fused into a snippets Subgraph (its reported precision is that of its ports,
    not of what it computes inside)."""
    found = []
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "originalLayersNames" not in info:
            continue
        kind = info["layerType"].astype(str) if "layerType" in info else ""
        precision = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else ""
        if kind == "Subgraph" or precision in ("bf16", "f16"):
            found += [n for n in info["originalLayersNames"].astype(str).split(",") if n in marked]
    return found


# Lines of OpenVINO's errors that locate or introduce the reason rather than give it.
_NOT_THE_REASON = re.compile(
    r"^(Exception from |Check '.*' failed at |FrontEnd API failed|Summary:|Model wasn't fully converted"
    r"|While validating |-- Conversion is failed for|-- .* with a message:)")


def engine_reason(exc: Exception) -> str:
    """The line of OpenVINO's multi-line error that says why ("Exception from core.cpp:84:" and
    "Check 'false' failed at …" come first, the reason last): it leads the message, so the
    verdict's one-line summary and its signature name the reason, not a source location."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if re.match(r"-- .* with a message:", line)]
    if len(starts) > 1:  # several operations failed to convert: the first one's reason, not the last's
        lines = lines[starts[0]:starts[1]]
    reasons = [line for line in lines if not _NOT_THE_REASON.match(line)]
    return (reasons or lines or [exc.__class__.__name__])[-1]


def onnx_io_names(model_path: str) -> tuple[list[str], list[str]]:
    """The ONNX graph's real inputs and its outputs, in order (weights are not read)."""
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in initializers], [o.name for o in graph.output]


def bind_inputs(ports, graph_inputs: list[str], feeds: dict) -> dict:
    """Feeds keyed by OpenVINO input index.

    OpenVINO folds while it reads: an input may carry another tensor's name (Dropout folded
    into an Identity leaves its port named after the output) or vanish (an empty ``axes``
    input). A port is bound by any of its names first; a port left over takes the feed of an
    unmatched ONNX input, the first in graph order whose shape it accepts; feeds of inputs
    OpenVINO dropped are not passed at all."""
    import openvino as ov

    names_in_order = graph_inputs + sorted(set(feeds) - set(graph_inputs))
    bound: dict[int, object] = {}
    for index, port in enumerate(ports):
        names = port.get_names()
        name = next((n for n in names_in_order if n in names and n in feeds), None)
        if name is not None:
            bound[index] = name
    spare = [n for n in names_in_order if n in feeds and n not in bound.values()]
    for index, port in enumerate(ports):
        if index in bound or not spare:
            continue
        declared = port.get_partial_shape()
        fits = [n for n in spare if declared.compatible(ov.PartialShape(list(np.shape(feeds[n]))))]
        bound[index] = (fits or spare)[0]
        spare.remove(bound[index])
    return {index: feeds[name] for index, name in bound.items()}


def reshape_to_feeds(model, bound: dict) -> None:
    """Give every input its feed's static shape before compiling: a model read with dynamic
    (or unknown) dimensions otherwise compiles for dynamic shapes, which the CPU plug-in refuses
    for some operations ("... with dynamic rank") although the feeds fix every shape."""
    import openvino as ov

    shapes = {}
    for index, array in bound.items():
        shape = ov.PartialShape(list(np.shape(array)))
        if model.inputs[index].get_partial_shape() != shape:
            shapes[model.inputs[index]] = shape
    if not shapes:
        return
    try:
        model.reshape(shapes)
    except Exception as exc:  # the engine's own refusal of these shapes
        raise BuildError(f"OpenVINO failed to reshape the model to the feeds' shapes: {engine_reason(exc)}\n{exc}") from exc


# OpenVINO element types whose ``Tensor.data`` is not the values: bf16 comes back viewed as
# float16, float8 as uint8 bits, and 4-/2-bit types as their packed bytes (shape [13] for a
# [5, 5] int4 tensor). They travel as raw bits, packed as ONNX packs them (the first element in
# the low bits), and are read through onnx's own decoder into ml_dtypes arrays.
_NARROW = {"bf16": "BFLOAT16", "f8e4m3": "FLOAT8E4M3FN", "f8e5m2": "FLOAT8E5M2", "f8e8m0": "FLOAT8E8M0",
           "i4": "INT4", "u4": "UINT4", "f4e2m1": "FLOAT4E2M1", "u2": "UINT2"}


def from_tensor(tensor) -> np.ndarray:
    """An output tensor as numpy, narrow types as their ml_dtypes type and real shape."""
    element = _NARROW.get(tensor.get_element_type().get_type_name())
    if element is None:
        return tensor.data.copy()
    from onnx import TensorProto, numpy_helper

    raw = tensor.data.reshape(-1).view(np.uint8).tobytes()
    proto = TensorProto(data_type=getattr(TensorProto, element), dims=list(tensor.shape), raw_data=raw)
    return numpy_helper.to_array(proto)


class RequestOutputs(Mapping):
    """An infer request's outputs by name, each copied out of the request only when read: the
    worker saves one at a time, so at most one copy exists beside the request's own buffers.
    Holds the request, which owns the memory the copies are made from."""

    def __init__(self, request, ports: dict):
        self.request = request
        self.ports = ports

    def __getitem__(self, name: str) -> np.ndarray:
        return from_tensor(self.request.get_output_tensor(self.ports[name]))

    def __iter__(self):
        return iter(self.ports)

    def __len__(self) -> int:
        return len(self.ports)


def to_tensor(array):
    """A feed OpenVINO takes: numpy's own dtypes as they are; ml_dtypes' (bfloat16, float8,
    int4 …) as an OpenVINO tensor of that type holding the bits, packed as ONNX packs them."""
    array = np.asarray(array)
    if array.dtype.isbuiltin != 2:
        return array
    import openvino as ov
    from onnx import helper, numpy_helper

    ov_type = next((name for name, element in _NARROW.items()
                    if helper.tensor_dtype_to_np_dtype(getattr(helper.TensorProto, element)) == array.dtype), None)
    if ov_type is None:
        raise BuildError(f"OpenVINO cannot take a feed of type {array.dtype.name}")
    tensor = ov.Tensor(getattr(ov.Type, ov_type), list(array.shape))
    raw = numpy_helper.from_array(array).raw_data
    tensor.data.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, np.uint8)
    return tensor


def output_ports(port_names: list[set[str]], graph_outputs: list[str], wanted: list[str]) -> dict:
    """name -> OpenVINO output index (None when absent) for every wanted output.

    A folded node merges tensor names, so a port may carry several (an output ``y`` computed
    by Relu→a→Identity→y is one port named {a, y}); ``get_any_name`` may pick the other one.
    Graph outputs map by position (OpenVINO keeps their order), anything else by any name."""
    by_position = len(port_names) == len(graph_outputs)
    ports = {}
    for name in wanted:
        if by_position and name in graph_outputs:
            ports[name] = graph_outputs.index(name)
        else:
            ports[name] = next((i for i, names in enumerate(port_names) if name in names), None)
    return ports
