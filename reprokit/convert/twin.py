"""The user's own converted model as the target of ``--reference-model``: any cut of the fp32
model (a candidate, a packed call, the whole model) mapped onto the same cut of the user's
explicit-precision twin, the model ModelOpt AutoCast or onnxconverter-common wrote.

Such converters keep node names and tensor names and insert Casts: a node of the fp32 model has
a twin in the converted model (same name, or same first output, and same op), and every node
of the converted model without a fp32 counterpart is an inserted one (a Cast) sitting on an
edge. A cut is mapped node by node: each fp32 node becomes its twin (with the twin's attributes
— ``to`` of a Cast, a Constant's fp16 value — unless reprokit itself changed the node's
attributes, e.g. a Reshape's shape while cropping), the inserted nodes in front of each twin
input come along on that edge, and every tensor keeps the cut's name, so packed calls and
renamed members map as they are. A weight is the converted model's own (as its converter wrote
it, clamped or rounded), unless reprokit cropped the cut's copy: then the cut's, cast. A cut
input the twin reads narrow is fed the reference activation cast to that type, by a Cast inside
the mapped model: the feeds stay the fp32 model's. Outputs keep the twin's type. A node without
a twin runs as in the fp32 cut.

Graph surgery only: runs no engine, judges nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, numpy_helper

from reprokit.graph.index import bodies
from reprokit.standalone.names import FreshNames

NARROW_TYPES = {TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
_MEMBER = re.compile(r"^rk\d+/|__rk\d+(\.\d+)?$")  # the names graph/pack.py gives a member's copies


class NotATwin(ValueError):
    """The two models are not an fp32 model and its conversion (names do not match)."""


def _types(model) -> dict[str, int]:
    """Element type of every tensor of ``model``'s main graph (shape inference, data-free)."""
    graph = onnx.GraphProto(name="types")
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    declared = {vi.name for vi in graph.input}
    graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, None)
        for t in model.graph.initializer
        if t.name not in declared
    )
    probe = helper.make_model(graph, opset_imports=model.opset_import)
    probe.ir_version = model.ir_version
    try:
        probe = onnx.shape_inference.infer_shapes(probe)
    except Exception:  # best effort: declared types still count
        pass
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in list(probe.graph.input) + list(probe.graph.value_info) + list(probe.graph.output)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type
    }
    for node in model.graph.node:  # what inference could not type: a Cast says its own type
        if node.op_type == "Cast" and node.output[0] not in types:
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    return types


def declared_precision(model) -> str | None:
    """fp16 or bf16: the narrow float type the converted model computes in (None: none)."""
    types = _types(model)
    counts = {
        label: sum(1 for t in types.values() if t == code) for code, label in NARROW_TYPES.items()
    }
    best = max(counts, key=counts.get)
    return best if counts[best] else None


@dataclass(frozen=True)
class Twins:
    """The fp32 model's nodes and their twins in the converted model, by position (protobuf
    wrappers have no stable identity)."""

    fp32: list  # the fp32 model's nodes
    by_name: dict[str, int]  # fp32 node name -> position
    by_output: dict[str, int]  # fp32 tensor -> position of the node producing it
    twin: dict[int, object]  # fp32 position -> converted node
    producer: dict[str, tuple[int, object]]  # converted tensor -> (position, converted node)
    inserted: frozenset[int]  # positions of converted nodes without a fp32 counterpart
    types: dict[str, int]  # converted tensor -> element type
    converted: object  # the converted ModelProto
    weights: dict[str, object]  # the converted model's initializers by name

    @classmethod
    def build(cls, fp32, converted) -> Twins:
        if any(True for n in converted.graph.node for _ in bodies(n)):
            raise NotATwin(
                "the converted model has If/Loop/Scan nodes, which --reference-model does not map yet"
            )
        nodes = list(converted.graph.node)
        by_name = {n.name: k for k, n in enumerate(nodes) if n.name}
        producer = {o: (k, n) for k, n in enumerate(nodes) for o in n.output if o}
        twin: dict[int, object] = {}
        matched: set[int] = set()
        for position, node in enumerate(fp32.graph.node):
            k = by_name.get(node.name) if node.name else None
            if k is None or nodes[k].op_type != node.op_type:
                k = (
                    producer[node.output[0]][0]
                    if node.output and node.output[0] in producer
                    else None
                )
            if (
                k is not None
                and nodes[k].op_type == node.op_type
                and len(nodes[k].input) == len(node.input)
            ):
                twin[position] = nodes[k]
                matched.add(k)
        if not twin:
            raise NotATwin("no node of the two models shares a name and an op")
        fp32_nodes = list(fp32.graph.node)
        return cls(
            fp32_nodes,
            {n.name: k for k, n in enumerate(fp32_nodes) if n.name},
            {o: k for k, n in enumerate(fp32_nodes) for o in n.output if o},
            twin,
            producer,
            frozenset(k for k in range(len(nodes)) if k not in matched),
            _types(converted),
            converted,
            {t.name: t for t in converted.graph.initializer},
        )

    def missing(self) -> list[str]:
        """fp32 nodes with no twin (named, first ten)."""
        return [n.name or n.output[0] for k, n in enumerate(self.fp32) if k not in self.twin][:10]

    def original(self, node) -> int | None:
        """The position of the fp32 node a cut's node copies: by its name, else by its first
        output (member prefixes of a pack removed); None for a node reprokit added."""
        for name, table in (
            (node.name, self.by_name),
            (node.output[0] if node.output else "", self.by_output),
        ):
            for key in (name, _MEMBER.sub("", name)):
                k = table.get(key) if key else None
                if (
                    k is not None
                    and self.fp32[k].op_type == node.op_type
                    and len(self.fp32[k].input) == len(node.input)
                ):
                    return k
        return None


class _Writer:
    """Builds one mapped cut: nodes, weights, and the Casts that bring a value to a type."""

    def __init__(self, twins: Twins, cut):
        self.twins = twins
        self.cut = cut
        self.pool = FreshNames.of(cut)
        self.types = _types(cut)  # the cut's own tensors (fp32 world); twin outputs overwrite
        self.weights = {t.name: t for t in cut.graph.initializer}
        self.nodes: list = []
        self.initializers: dict[str, object] = {}
        self.casts: dict[tuple[str, int], str] = {}
        self.chains: dict[tuple[str, str], str] = {}

    def value(self, name: str, want: int | None) -> str:
        """``name`` of the cut as element type ``want`` (a Cast, or a cast copy of a weight)."""
        if not name or want is None or self.types.get(name) == want or self.types.get(name) is None:
            if name in self.weights:
                self.initializers[name] = self.weights[name]
            return name
        key = (name, want)
        if key not in self.casts:
            new = self.pool.fresh(f"{name}__rk_as_{NARROW_TYPES.get(want, want)}")
            if name in self.weights:
                array = numpy_helper.to_array(self.weights[name]).astype(
                    helper.tensor_dtype_to_np_dtype(want)
                )
                self.initializers[new] = numpy_helper.from_array(array, new)
            else:
                self.nodes.append(helper.make_node("Cast", [name], [new], to=want, name=new))
            self.types[new] = want
            self.casts[key] = new
        return self.casts[key]

    def weight(self, cut_name: str, weight) -> str:
        """The converted model's own copy of a weight the cut names ``cut_name`` (a converter may
        have clamped or rounded it: onnxconverter-common clamps to ±10000 by default)."""
        key = (cut_name, weight.name)
        if key not in self.chains:
            copy = onnx.TensorProto()
            copy.CopyFrom(weight)
            copy.name = self.pool.fresh(f"{cut_name}__rk_twin")
            self.initializers[copy.name] = copy
            self.types[copy.name] = copy.data_type
            self.chains[key] = copy.name
        return self.chains[key]

    def resolve(self, tensor: str, cut_name: str) -> str:
        """The converted model's input ``tensor`` of a twin, on the edge the cut calls
        ``cut_name``: inserted nodes on that edge are copied, anything else is the cut's value."""
        position, node = self.twins.producer.get(tensor, (None, None))
        weight = self.twins.weights.get(tensor) if node is None else None
        if (
            weight is not None
            and cut_name in self.weights
            and list(weight.dims) == list(self.weights[cut_name].dims)
        ):
            return self.weight(
                cut_name, weight
            )  # the user's converted weight, as the converter wrote it
        if not tensor or node is None or position not in self.twins.inserted:
            return self.value(cut_name, self.twins.types.get(tensor))
        key = (cut_name, tensor)
        if key not in self.chains:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [self.resolve(t, cut_name) for t in node.input]
            outputs = [self.pool.fresh(f"{cut_name}__rk_twin") if o else "" for o in node.output]
            copy.output[:] = outputs
            copy.name = self.pool.fresh(f"{node.name or node.op_type}__rk_twin")
            for o, new in zip(node.output, outputs, strict=True):
                if o in self.twins.types:
                    self.types[new] = self.twins.types[o]
            self.nodes.append(copy)
            self.chains[key] = outputs[list(node.output).index(tensor)]
        return self.chains[key]

    def add(self, node) -> None:
        position = self.twins.original(node)
        twin = self.twins.twin.get(position) if position is not None else None
        if twin is None:  # a node reprokit added (or one the converter changed): as in the fp32 cut
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [self.value(i, self.types.get(i)) for i in node.input]
            self.nodes.append(copy)
            return
        copy = onnx.NodeProto()
        copy.CopyFrom(twin)
        if list(node.attribute) != list(
            self.twins.fp32[position].attribute
        ):  # reprokit changed it (a crop): the cut's
            del copy.attribute[:]
            copy.attribute.extend(node.attribute)
        copy.name = node.name
        copy.input[:] = [
            self.resolve(t, c) if c else "" for t, c in zip(twin.input, node.input, strict=True)
        ]
        outputs = list(node.output) + [""] * (len(twin.output) - len(node.output))
        copy.output[:] = outputs[: len(twin.output)]
        for t, c in zip(twin.output, copy.output, strict=True):
            if c and t in self.twins.types:
                self.types[c] = self.twins.types[t]
        self.nodes.append(copy)


def map_cut(twins: Twins, cut) -> onnx.ModelProto:
    """The converted model's version of ``cut`` (a ModelProto cut from the fp32 model): same
    graph inputs (fp32 feeds), same output names (the converted model's types)."""
    writer = _Writer(twins, cut)
    for node in cut.graph.node:
        writer.add(node)
    graph = helper.make_graph(
        writer.nodes,
        cut.graph.name or "twin",
        list(cut.graph.input),
        [],
        list(writer.initializers.values()),
    )
    for out in cut.graph.output:
        typed = onnx.ValueInfoProto()
        typed.CopyFrom(out)
        elem = writer.types.get(out.name)
        if elem and typed.type.HasField("tensor_type"):
            typed.type.tensor_type.elem_type = elem
        graph.output.append(typed)
    model = helper.make_model(graph, opset_imports=twins.converted.opset_import)
    model.ir_version = twins.converted.ir_version
    return model


class TargetModels:
    """The oracle's ``target_model``: a cut's file -> the file of its converted twin, written
    beside it (``NAME.target.onnx``); the fp32 model's own file -> the user's converted file,
    when it reads the same inputs and gives every fp32 output (else its mapped copy, which casts
    the fp32 feeds and names every output)."""

    def __init__(self, fp32, fp32_path: str, converted_path: str):
        self.converted_path = converted_path
        self.fp32_path = os.path.abspath(fp32_path)
        converted = onnx.load(converted_path)
        self.twins = Twins.build(fp32, converted)

        def inputs(model):
            return [(v.name, v.type.tensor_type.elem_type) for v in model.graph.input]

        outputs = {v.name for v in converted.graph.output}
        self.same_inputs = inputs(fp32) == inputs(converted) and all(
            v.name in outputs for v in fp32.graph.output
        )
        self.as_is: set[str] = (
            set()
        )  # whole converted models the target runs unmapped (a reconversion)

    def __call__(self, path: str) -> str:
        if os.path.abspath(path) in self.as_is:
            return path
        if os.path.abspath(path) == self.fp32_path and self.same_inputs:
            return self.converted_path
        mapped = os.path.splitext(path)[0] + ".target.onnx"
        onnx.save(map_cut(self.twins, onnx.load(path)), mapped)
        return mapped
