"""Every TensorProto an ONNX model can hold, walked in one place: graph initializers, sparse
initializers (values and indices), node attributes (``t``, ``tensors``, ``sparse_tensor`` as in
``Constant``'s ``sparse_value``, ``sparse_tensors``), subgraphs (``g``, ``graphs``: If/Loop/Scan
bodies, at any depth) and model-local function bodies. What reads or checks tensors (external
data containment, weight sizes, inlining) walks this, so no kind of tensor is ever skipped.
Reads no file and changes nothing.
"""

from __future__ import annotations


def all_tensors(model):
    """Every TensorProto of ``model`` (a ModelProto), subgraphs and function bodies included."""
    yield from graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def graph_tensors(graph):
    """Every TensorProto of one graph and of the subgraphs its nodes hold."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from _sparse(sparse)
    yield from _node_tensors(graph.node)


def _sparse(sparse):
    yield sparse.values
    if sparse.HasField("indices"):
        yield sparse.indices


def _node_tensors(nodes):
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield from _sparse(attr.sparse_tensor)
            for sparse in attr.sparse_tensors:
                yield from _sparse(sparse)
            for body in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                yield from graph_tensors(body)
