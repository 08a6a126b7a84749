"""Subgraph scopes for the conversion: which names a graph defines and reads from enclosing
scopes (If/Loop/Scan bodies), renaming outer references, and :class:`Scope`, one graph being
rewritten with the places its new nodes go.

Must not decide types: that is :mod:`reprokit.convert.planning`'s.
"""

from __future__ import annotations

from collections import defaultdict

import onnx


def subgraphs(node):
    """The bodies a node holds (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def node_names(graph):
    """Names of the nodes of ``graph`` and of its subgraphs."""
    for node in graph.node:
        yield node.name
        for sub in subgraphs(node):
            yield from node_names(sub)


def defined(graph) -> set[str]:
    names = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    return names | {o for node in graph.node for o in node.output if o}


def outer_refs(graph) -> set[str]:
    """Names a (sub)graph reads from enclosing scopes."""
    used = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for sub in subgraphs(node):
            used |= outer_refs(sub)
    used.update(o.name for o in graph.output)
    return used - defined(graph)


def rename_refs(graph, old: str, new: str) -> None:
    """Point every read of outer ``old`` in subgraph ``graph`` (and nested scopes) at ``new``."""
    for out in graph.output:
        if out.name == old:
            out.name = new
    rename_reads(graph, old, new)


def rename_reads(graph, old: str, new: str) -> None:
    """Point every node input of ``graph`` that reads ``old`` at ``new``, and the reads of it in
    nested scopes that do not define their own ``old``; ``graph``'s outputs keep their names."""
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for sub in subgraphs(node):
            if old not in defined(sub):
                rename_refs(sub, old, new)


class Scope:
    """One graph being rewritten: its facts, and where new nodes go."""

    def __init__(self, graph, io: str):
        self.graph = graph
        self.io = io  # precision of the scope's float inputs and outputs
        declared = {vi.name for vi in graph.input}
        self.inits = {t.name: t for t in graph.initializer if t.name not in declared}
        self.producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
        self.outputs: list[str] = []  # float outputs, set by the converter
        self.needs: dict[str, set[str]] = defaultdict(set)  # tensor → precisions its readers want
        self.made: dict[tuple[str, str], str] = {}  # (tensor, precision) → its copy
        self._front: list = []  # copies of inputs and outer names, placed first
        self._after: dict[int, list] = defaultdict(list)  # producer index → nodes after it

    def place(self, name: str, node) -> None:
        """Put ``node`` (which reads ``name``) right after ``name``'s producer."""
        if name in self.producer:
            self._after[self.producer[name]].append(node)
        else:
            self._front.append(node)

    def rebuild(self) -> None:
        nodes = list(self._front)
        for index, node in enumerate(self.graph.node):
            nodes.append(node)
            nodes.extend(self._after.get(index, ()))
        del self.graph.node[:]
        self.graph.node.extend(nodes)
