"""Fresh names for graph rewrites: the one rule for every node, tensor and initializer name that
reprokit adds to a model (emulation casts, fp16 conversion, packs, fused LayerNorms).

A name is fresh when nothing in the model uses it yet: no node, tensor, initializer, graph input
or output, in subgraph bodies too (node and tensor names share one pool, which is stricter than
ONNX needs and keeps the rule simple). The preferred name is kept when free, so rewrites of
models without collisions name things as they always did; otherwise a counter is appended.

Kept free of reprokit imports on purpose: report archives embed it verbatim in their standalone
``repro.py`` beside ``emulation.py``, which uses it.
"""

from __future__ import annotations


def graph_names(graph) -> set[str]:
    """Every name ``graph`` (an ONNX GraphProto) and the bodies nested in it use."""
    names = {vi.name for vi in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names.update(t.name for t in graph.initializer)
    names.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
        for attr in node.attribute:
            bodies = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for body in bodies:
                names |= graph_names(body)
    names.discard("")
    return names


class FreshNames:
    """A pool of taken names; :meth:`fresh` hands out names outside it and takes them."""

    def __init__(self, taken=()):
        self.taken: set[str] = set(taken)

    @classmethod
    def of(cls, model) -> FreshNames:
        """The pool of an ONNX ModelProto (or GraphProto): every name it uses, bodies included."""
        return cls(graph_names(getattr(model, "graph", model)))

    def fresh(self, base: str, sep: str = "_") -> str:
        """``base`` if nobody uses it, else ``base{sep}2``, ``base{sep}3`` … ; taken from now on."""
        name, count = base, 1
        while name in self.taken:
            count += 1
            name = f"{base}{sep}{count}"
        self.taken.add(name)
        return name

    def take(self, names) -> None:
        """Mark ``names`` as used (names the caller keeps, or that another part of it adds)."""
        self.taken.update(n for n in names if n)

    def __contains__(self, name: str) -> bool:
        return name in self.taken
