"""A model's structure, read once: :class:`GraphIndex` (producers AND consumers of the top-level
nodes, initializers, inputs, outputs, inferred types) and the ONE walker of subgraph scopes — the
bodies a node holds (If branches, Loop/Scan bodies), the names a scope defines, the outer names it
reads, renaming those reads, and every node of a graph with its bodies.

The scope rule, used by extraction, packing, control-flow opening, branch surgery and the fp16
conversion alike: a body reads an outer name where one of its node inputs, or one of its own
outputs, names something that neither it nor a body around it (up to the node that holds it)
defines. A branch output may name an outer tensor directly (``then_branch`` returning ``x``):
that is a read of ``x`` too. A scope defines its inputs, its initializers and its nodes' outputs.

Must not run engines, read tensor values or know about divergence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from reprokit.graph import quant

RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


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


def bodies(node) -> Iterator:
    """The subgraph bodies of ``node`` (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        yield from attr.graphs
        if attr.HasField("g"):
            yield attr.g


def has_bodies(node) -> bool:
    return any(True for _ in bodies(node))


def iter_graphs(graph) -> Iterator:
    """``graph`` and every body nested in it, outermost first."""
    yield graph
    for node in graph.node:
        for body in bodies(node):
            yield from iter_graphs(body)


def iter_nodes(graph) -> Iterator:
    """Every node of ``graph``, those inside its (nested) bodies included."""
    for scope in iter_graphs(graph):
        yield from scope.node


def count_nodes(graph) -> int:
    """Nodes of ``graph``, those inside subgraph bodies included."""
    return sum(1 for _ in iter_nodes(graph))


def node_names(graph) -> list[str]:
    """Names of the nodes of ``graph`` and of its bodies (unnamed nodes give ``""``)."""
    return [node.name for node in iter_nodes(graph)]


def defined_names(graph) -> set[str]:
    """Names the scope ``graph`` itself defines: its inputs, initializers and node outputs."""
    names = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    names.update(t.values.name for t in graph.sparse_initializer)
    names.update(o for node in graph.node for o in node.output if o)
    return names


def outer_refs(graph) -> set[str]:
    """Names the (sub)graph ``graph`` reads from enclosing scopes: node inputs, reads of nested
    bodies and outputs it does not define itself."""
    used = {i for node in graph.node for i in node.input if i}
    for node in graph.node:
        used |= outer_scope_names(node)
    used.update(o.name for o in graph.output)
    return used - defined_names(graph)


def outer_scope_names(node) -> set[str]:
    """Names ``node``'s bodies read from the graph that holds it (its implicit inputs)."""
    names: set[str] = set()
    for body in bodies(node):
        names |= outer_refs(body)
    return names


def rename_outer_refs(body, mapping: dict[str, str], shadow: frozenset | set = frozenset()) -> None:
    """Inside the body ``body``, rename its reads of outer names (node inputs, nested bodies'
    reads, its outputs) by ``mapping``; names the body (or a body around it, ``shadow``) defines
    itself stay."""
    local = set(shadow) | defined_names(body)
    for node in body.node:
        node.input[:] = [i if (not i or i in local) else mapping.get(i, i) for i in node.input]
        for inner in bodies(node):
            rename_outer_refs(inner, mapping, local)
    for out in body.output:
        if out.name not in local and out.name in mapping:
            out.name = mapping[out.name]


def rename_reads(graph, mapping: dict[str, str]) -> None:
    """Point every read of a name in ``mapping`` inside ``graph`` at its new name: node inputs of
    ``graph`` and the bodies' outer reads; ``graph``'s own outputs keep their names."""
    for node in graph.node:
        node.input[:] = [mapping.get(i, i) if i else i for i in node.input]
        for body in bodies(node):
            rename_outer_refs(body, mapping)


def node_reads(node) -> tuple[str, ...]:
    """What ``node`` reads: its data inputs, then its bodies' outer reads (sorted)."""
    inputs = [i for i in node.input if i]
    for extra in sorted(outer_scope_names(node)):
        if extra not in inputs:
            inputs.append(extra)
    return tuple(inputs)


def consumers_of(graph) -> dict[str, list[int]]:
    """tensor → indices of the nodes of ``graph`` that read it (bodies' outer reads included)."""
    return _readers([node_reads(node) for node in graph.node])


def _readers(node_inputs) -> dict[str, list[int]]:
    consumers: dict[str, list[int]] = {}
    for index, inputs in enumerate(node_inputs):
        for tensor in inputs:
            consumers.setdefault(tensor, []).append(index)
    return consumers


@dataclass(frozen=True)
class GraphIndex:
    """Producer/consumer facts of a model's top-level graph, computed once and shared by every
    extraction."""

    node_inputs: tuple[tuple[str, ...], ...]  # per node: data inputs + implicit outer-scope refs
    node_outputs: tuple[tuple[str, ...], ...]
    producer: dict  # tensor -> node index
    initializers: dict  # name -> TensorProto
    graph_inputs: frozenset
    graph_outputs: tuple[str, ...]
    value_info: dict  # name -> ValueInfoProto (from shape inference)
    constants: frozenset = frozenset()  # tensors that depend on no graph input (foldable)
    declared: dict = field(default_factory=dict)  # graph input -> its ValueInfoProto as the model declares it
    consumers: dict = field(default_factory=dict)  # tensor -> indices of the nodes that read it
    # node -> its Q/DQ unit (graph/quant.py): the nodes every candidate keeps together or not at all
    units: dict = field(default_factory=dict)
    regions: dict = field(default_factory=dict)  # node -> it with the Q/DQ units around it (quant.regions)
    quantized: frozenset = frozenset()  # integer activations quantizing ops make (quant.integer_activations)

    @classmethod
    def build(cls, model) -> GraphIndex:
        graph = model.graph
        node_inputs = tuple(node_reads(node) for node in graph.node)
        node_outputs = tuple(tuple(o for o in node.output if o) for node in graph.node)
        producer = {out: index for index, outs in enumerate(node_outputs) for out in outs}
        initializers = {t.name: t for t in graph.initializer}
        inputs = frozenset(i.name for i in graph.input if i.name not in initializers)
        constants: set[str] = set()
        for index, node in enumerate(graph.node):
            if node.op_type in RANDOM or has_bodies(node):
                continue
            if all(t in initializers or t in constants for t in node_inputs[index]):
                constants.update(node_outputs[index])
        declared = {i.name: i for i in graph.input if i.name in inputs}
        built = cls(node_inputs, node_outputs, producer, initializers, inputs,
                    tuple(o.name for o in graph.output), inferred_value_info(model), frozenset(constants),
                    declared, _readers(node_inputs))
        found = quant.units(model, built)
        integers = quant.integer_activations(model)
        if not found and not integers:
            return built
        return dataclasses.replace(built, units=found, regions=quant.regions(model, built, found),
                                   quantized=integers)

    def region(self, index: int) -> frozenset:
        """The smallest candidate that holds node ``index``: itself, or in a quantized model
        itself with the Q/DQ units that feed it and quantize its outputs."""
        return self.regions.get(index) or frozenset([index])

    def splits_unit(self, nodes) -> frozenset | None:
        """The first Q/DQ unit ``nodes`` holds only part of (None: every unit whole or absent):
        the one rule that keeps a QuantizeLinear and its DequantizeLinear together in every
        candidate, pass, shape crop and extraction."""
        return quant.splits_unit(nodes, self.units) if self.units else None

    def ancestors(self, index: int, within: set[int] | None = None) -> set[int]:
        """Nodes ``index`` depends on (itself included), optionally only inside ``within``."""
        seen, stack = {index}, [index]
        while stack:
            for tensor in self.node_inputs[stack.pop()]:
                parent = self.producer.get(tensor)
                if parent is not None and parent not in seen and (within is None or parent in within):
                    seen.add(parent)
                    stack.append(parent)
        return seen

    def descendants(self, index: int, within: set[int] | None = None) -> set[int]:
        """Nodes that depend on ``index`` (itself included), optionally only inside ``within``."""
        seen, stack = {index}, [index]
        while stack:
            for tensor in self.node_outputs[stack.pop()]:
                for child in self.consumers.get(tensor, ()):
                    if child not in seen and (within is None or child in within):
                        seen.add(child)
                        stack.append(child)
        return seen
