""":class:`Scope`: one graph (the main graph or an If/Loop/Scan body) being converted, with the
places its new nodes go. Which names a scope defines and reads from enclosing scopes, and renaming
those reads, is :mod:`reprokit.graph.index`'s (the one scope walker).

Must not decide types: that is :mod:`reprokit.convert.planning`'s.
"""

from __future__ import annotations

from collections import defaultdict


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
