"""Packed candidates: one ONNX model holding several disjoint candidate subgraphs.

Each member is an extraction (its nodes, its initializers, its cut inputs fed with captured
reference activations) copied into the pack under its own names, so no two members share a
tensor: an engine cannot fuse, merge or constant-share across them, and each member's outputs are
read back under its own names and judged on their own. Graph surgery only: no engine runs here.

Two naming modes. When the members' node sets overlap (numeric searches: regions of different
widths, "minimal minus one node"), every tensor and node name gets a member prefix. When they
are disjoint (pass/fail checks that may look at node names, like polygraphy's), node names stay
exactly as in the user's model and only tensors two members would share get a member copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reprokit.graph.index import bodies, rename_outer_refs
from reprokit.graph.model import name_unnamed_nodes
from reprokit.standalone.names import FreshNames


@dataclass
class Member:
    """Where one candidate's outputs are found in the pack: packed name -> original name."""

    outputs: dict[str, str]
    nodes: int


@dataclass
class Pack:
    model: object  # onnx.ModelProto
    feeds: dict[str, np.ndarray]
    members: list[Member] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return sum(m.nodes for m in self.members)


def feed_bytes(extraction) -> int:
    return int(sum(np.asarray(v).nbytes for v in extraction.feeds.values()))


def feed_key(value) -> tuple:
    """Which data a feed holds, without reading it: two feeds with one key hold the same
    values (the same bytes of one memory-mapped file, or of one array in memory, seen with the
    same shape, strides and dtype). Captured activations are read memory-mapped, so every
    candidate cut at one tensor gets a feed of the same key."""
    array = np.asarray(value)
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    start = array.__array_interface__["data"][0]
    where = ("array", id(root), start)
    if isinstance(root, np.memmap) and root.filename:
        where = ("file", root.filename, root.offset + start - root.__array_interface__["data"][0])
    return (*where, array.shape, array.strides, array.dtype.str)


def same_weight(a, b) -> bool:
    """Do two initializers of one name hold the same weight (a shape try's cropped copy does
    not)? Type, dims, then the bytes themselves: comparing them is several times cheaper than
    digesting each (a Swin survey pack digested 12,000 weights, 3 s of its run), and only a
    name met twice is compared."""
    if a.data_type != b.data_type or list(a.dims) != list(b.dims) or a.data_location != b.data_location:
        return False
    if a.raw_data or b.raw_data:
        return a.raw_data == b.raw_data
    left, right = type(a)(), type(b)()  # typed fields or external data: everything but the name
    left.CopyFrom(a)
    right.CopyFrom(b)
    left.name = right.name = ""
    return left.SerializeToString(deterministic=True) == right.SerializeToString(deterministic=True)


def build_pack(extractions: list, *, keep_node_names: bool, same_node_names: bool = False,
               share_feeds: bool = False) -> Pack:
    """One model holding every extraction as its own copy. ``keep_node_names`` requires the
    members to have disjoint node sets (names stay unique only then). ``same_node_names``: the
    tensors of each copy are renamed but its nodes keep their names, duplicates included (a
    target that selects nodes by name, ``fp32-nodes=``, must find them in every copy).
    ``share_feeds`` (only for engines that run every node as written, never with
    ``keep_node_names``): members whose feeds hold the same data (:func:`feed_key`) read one
    graph input, so the engine holds that data once instead of once per member; and members
    reading the same weight (its name and bytes) read one initializer: the pack's file holds
    the model's weights once, not once per member that reads them (a Swin survey wrote and
    serialized gigabytes of copies). Never with ``same_node_names``: an emulated ``fp32-nodes=``
    decides a weight's type from all its readers."""
    import onnx

    # built in place in its model: helper.make_model copies a graph it is given, every member's
    # weights included
    model = onnx.ModelProto(producer_name="reprokit")
    graph = model.graph
    graph.name = "reprokit_pack"
    feeds: dict[str, np.ndarray] = {}
    members: list[Member] = []
    taken = FreshNames()
    shared: dict[tuple, str] = {}  # feed_key -> the packed input holding it (share_feeds)
    share_weights = share_feeds and not keep_node_names and not same_node_names
    weights: dict[str, list] = {}  # name -> (a member's initializer, the packed one holding it), per distinct weight
    counts: dict[str, int] = {}
    if keep_node_names:  # a tensor name appearing in two members gets a copy per member
        for ext in extractions:
            for name in _names(ext.model.graph):
                counts[name] = counts.get(name, 0) + 1
        taken.take(n for n, c in counts.items() if c == 1)  # kept as they are: no copy may take them
    for number, ext in enumerate(extractions):
        sub = ext.model.graph
        local = _names(sub)
        if keep_node_names:
            mapping = {n: taken.fresh(f"{n}__rk{number}", ".") for n in local if counts.get(n, 0) > 1}
        else:
            mapping = {n: taken.fresh(f"rk{number}/{n}", ".") for n in local}
        reused = set()  # this member's inputs read from an earlier member's copy
        if share_feeds and not keep_node_names:
            for value in sub.input:
                if ext.feeds.get(value.name) is not None and not isinstance(ext.feeds[value.name], (list, tuple)):
                    key = feed_key(ext.feeds[value.name])
                    if key in shared:
                        mapping[value.name] = shared[key]
                        reused.add(value.name)
                    else:
                        shared[key] = mapping[value.name]
        own_weights = list(sub.initializer)
        if share_weights:
            own_weights = []
            for init in sub.initializer:
                held = next((packed for first, packed in weights.get(init.name, ()) if same_weight(first, init)), None)
                if held is not None:
                    mapping[init.name] = held
                else:
                    weights.setdefault(init.name, []).append((init, mapping[init.name]))
                    own_weights.append(init)
        for node in sub.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [mapping.get(i, i) for i in copy.input]
            copy.output[:] = [mapping.get(o, o) for o in copy.output]
            if not keep_node_names and not same_node_names and copy.name:
                copy.name = f"rk{number}/{copy.name}"
            for body in bodies(copy):
                rename_outer_refs(body, mapping, set())
            graph.node.append(copy)
        for init in own_weights:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = mapping.get(init.name, init.name)
            graph.initializer.append(copy)
        for value in sub.input:
            if value.name in reused:
                continue
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(value)
            copy.name = mapping.get(value.name, value.name)
            graph.input.append(copy)
            if value.name in ext.feeds:
                feeds[copy.name] = ext.feeds[value.name]
        outputs = {}
        for value in sub.output:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(value)
            copy.name = mapping.get(value.name, value.name)
            graph.output.append(copy)
            outputs[copy.name] = value.name
        members.append(Member(outputs, len(sub.node)))
    opsets, ir_version, functions = declared([ext.model for ext in extractions])
    model.ir_version = ir_version
    model.opset_import.extend(opsets)
    model.functions.extend(functions)
    return Pack(model, feeds, members)


def declared(models: list) -> tuple[list, int, list]:
    """What a model holding every one of ``models`` must declare: each domain any of them
    imports (at the highest version declared: members cut from one model agree, and a probe
    declares the model's own, :func:`reprokit.shrink.confirm.probe_model`), the highest IR
    version, every local function once. The first member alone is not enough: a pack that
    starts with a probe written at another opset would read the model's nodes under that
    opset's schemas (torch-exported ``Reshape`` at opset 13 instead of 17: an invalid model)."""
    from onnx import helper

    versions: dict[str, int] = {}
    for model in models:
        for entry in model.opset_import:
            domain = entry.domain or ""
            versions[domain] = max(versions.get(domain, 0), entry.version)
    seen, functions = set(), []
    for model in models:
        for function in model.functions:
            if (function.domain, function.name) not in seen:
                seen.add((function.domain, function.name))
                functions.append(function)
    opsets = [helper.make_opsetid(domain, version) for domain, version in versions.items()]
    return opsets, max(model.ir_version for model in models), functions


def _names(graph) -> set[str]:
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o.name for o in graph.output}
    for node in graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
    return names


def model_copies(model, sets: list[list[str]]):
    """One model holding a whole copy of ``model`` per set of node names (a target's
    ``fp32-nodes=`` per copy): graph inputs and weights shared, every node and computed tensor
    renamed ``rk{i}/…``. Returns (model, per copy {packed output: output}, every copy's set under
    its renamed node names). Unnamed nodes are named OP_INDEX first, as fp32-nodes= names them.
    A weight's private copy is a copy of its TensorProto: of a model whose weights are external
    data (:func:`reprokit.graph.io.weights_apart`), a reference to the same bytes."""
    import onnx

    source = onnx.ModelProto.FromString(model.SerializeToString())
    name_unnamed_nodes(source)
    graph = source.graph
    shared = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    computed = {o for n in graph.node for o in n.output if o}
    # built in place in its model: helper.make_model copies a graph it is given, weights and all
    made = onnx.ModelProto(ir_version=source.ir_version, producer_name="reprokit")
    made.opset_import.extend(source.opset_import)
    packed = made.graph
    packed.name = "reprokit_fp32_sets"
    packed.input.extend(graph.input)
    packed.initializer.extend(graph.initializer)
    weights = {t.name: t for t in graph.initializer}
    outputs, names = [], []
    for number, keep in enumerate(sets):
        prefix = f"rk{number}/"
        mapping = {t: prefix + t for t in computed if t not in shared}
        # A weight a kept node reads gets this copy's own: engines decide a shared weight's
        # type from all its readers (the emulator leaves it unrounded only when every reader
        # is kept), and the other copies' readers are not this copy's business.
        kept = set(keep)
        for node in graph.node:
            if node.name in kept:
                for name in node.input:
                    if name in weights and name not in mapping:
                        mapping[name] = prefix + name
                        private = onnx.TensorProto()
                        private.CopyFrom(weights[name])
                        private.name = mapping[name]
                        packed.initializer.append(private)
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = prefix + node.name
            copy.input[:] = [mapping.get(i, i) for i in copy.input]
            copy.output[:] = [mapping.get(o, o) for o in copy.output]
            for body in bodies(copy):
                rename_outer_refs(body, mapping, set())
            packed.node.append(copy)
        own = {}
        for value in graph.output:
            out = onnx.ValueInfoProto()
            out.CopyFrom(value)
            out.name = mapping.get(value.name, value.name)
            if out.name in own:
                continue  # an input passed straight through: read once
            packed.output.append(out)
            own[out.name] = value.name
        outputs.append(own)
        names.extend(prefix + n for n in keep)
    made.functions.extend(source.functions)
    return made, outputs, names
