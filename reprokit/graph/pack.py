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


def build_pack(extractions: list, *, keep_node_names: bool, same_node_names: bool = False) -> Pack:
    """One model holding every extraction as its own copy. ``keep_node_names`` requires the
    members to have disjoint node sets (names stay unique only then). ``same_node_names``: the
    tensors of each copy are renamed but its nodes keep their names, duplicates included (a
    target that selects nodes by name, ``fp32-nodes=``, must find them in every copy)."""
    import onnx
    from onnx import helper

    first = extractions[0].model
    graph = onnx.GraphProto(name="reprokit_pack")
    feeds: dict[str, np.ndarray] = {}
    members: list[Member] = []
    taken = FreshNames()
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
        for init in sub.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = mapping.get(init.name, init.name)
            graph.initializer.append(copy)
        for value in sub.input:
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
    model = helper.make_model(graph, opset_imports=list(first.opset_import), ir_version=first.ir_version,
                              producer_name="reprokit")
    model.functions.extend(first.functions)
    return Pack(model, feeds, members)


def _names(graph) -> set[str]:
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o.name for o in graph.output}
    for node in graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
    return names
