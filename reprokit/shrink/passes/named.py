"""named: the engine's own message names the node — try that node first.

Parsers and loaders usually say where they stopped: TensorRT's ONNX parser ("In node 5 with
name: unique_1 and operator: Unique (parseNode): UNSUPPORTED_NODE"), onnxruntime ("… node with
name 'unique_1'"), OpenVINO ("<Node(Conv): …/Conv_output_0>"). Nodes whose name, or one of whose
output tensors, appears in the message are judged alone first (group-tested when several), fed
with what they need, then all of them together (a message naming two nodes often names their
fusion); failing that, nodes of an operator type the message names — the earliest alone first, as
such a message is usually true of each of them. A few named nodes are asked alone one by one, not
packed: a pass/fail check's first pack costs a calibration of the whole model. Usually one call
settles a build error this way, whatever the size of the model.
"""

from __future__ import annotations

import re

from reprokit.shrink.passes.conflict import whole_units

# More nodes than this named by op type alone means the message names a kind, not a place.
MAX_BY_OP = 16
ALONE = 3  # at most this many named nodes are asked alone, one call each, before any group test


def suspects(reducer, message: str) -> list[int]:
    """Nodes of the best that the message names: by node or tensor name, else by op type."""
    return _suspects(reducer, message)[0]


def _suspects(reducer, message: str) -> tuple[list[int], bool]:
    """:func:`suspects`, and whether they were found by op type (the message names a kind)."""
    if not message:
        return [], False
    model = reducer.model
    best = reducer.ordered()

    def mentioned(name: str) -> bool:
        # whole names only: not inside a longer name (a "name:" at the end of a clause is fine)
        pattern = r"(?<![\w/.:-])" + re.escape(name) + r"(?![\w/.-]|:[\w/])"
        return bool(name) and re.search(pattern, message) is not None

    by_name = [i for i in best if mentioned(model.graph.node[i].name)
               or any(len(t) > 2 and mentioned(t) for t in reducer.index.node_outputs[i])]
    if by_name:
        return by_name, False
    ops = {model.graph.node[i].op_type for i in best}
    named_ops = {op for op in ops if len(op) > 2 and re.search(r"\b" + re.escape(op) + r"\b", message)}
    by_op = [i for i in best if model.graph.node[i].op_type in named_ops]
    return (by_op, True) if len(by_op) <= MAX_BY_OP else ([], False)


def run(reducer, message: str) -> bool:
    """Accept the first named node that reproduces alone; True when one did."""
    nodes, by_op = _suspects(reducer, message)
    if not nodes or not reducer.smaller(nodes):
        return False
    # a quantized model: each candidate holds the Q/DQ units it touches whole (OpenVINO names a
    # DequantizeLinear as the Multiply it becomes; alone it is an invalid candidate, not a pass)
    whole = whole_units(reducer)
    candidates = [whole([i]) for i in nodes]
    # Asked alone first, one call of one node each: a few named nodes (a fusion's two), or the
    # earliest node of a type the message names ("No importer registered for op: Erf" is usually
    # true of each). Group testing them would build a pack, and for a check command a
    # calibration of the whole model before it (BERT's Erf: 3 calls and 244 nodes more; the
    # 69-node conv_clip fusion's two names: 69); the rest are group-tested.
    for cand in candidates[: 1 if by_op else ALONE if len(nodes) <= ALONE else 0]:
        if reducer.test(cand):
            reducer.accept(cand, "the node the engine's message names" if not by_op
                           else "the earliest node of the operator the message names")
            return True
    hit = reducer.first_interesting(candidates)
    if hit is None and reducer.interactions:  # the named nodes fail only together
        reducer.accept(min(reducer.interactions, key=len), "the nodes the engine's message names, together")
        return True
    if hit is None and len(nodes) > 1:
        # A message that names several nodes often names a fusion of them: together, connected.
        together = whole(nodes)
        if reducer.test(together):
            reducer.accept(together, "the nodes the engine's message names, together")
            return True
    if hit is None:
        return _with_context(reducer, _context_node(reducer, nodes), whole)
    reducer.accept(candidates[hit], "the node the engine's message names")
    return True


def _context_node(reducer, nodes: list[int]) -> int:
    """The named node whose inputs' producers are tried: the first, or in a quantized model the
    latest named node outside the Q/DQ units — the op the message is about; the units it names
    are its inputs' (a dequantized bias Add on the rapidocr classifier, issue 39)."""
    units = getattr(reducer.index, "units", None) or {}
    plain = [n for n in nodes if n not in units]
    return plain[-1] if units and plain else nodes[0]


def _with_context(reducer, node: int, whole=frozenset) -> bool:
    """The named node fails only with what feeds it (an unknown rank or type made upstream: an
    If whose branches differ, a dynamic input): its ancestors within 1, 2, 4 … 32 hops, one call
    each, until one reproduces or the cone stops growing."""
    cone, reached, depth = frozenset([node]), frozenset([node]), 0
    while depth < 32 and reducer.smaller(cone):
        depth = max(1, depth * 2)
        grown = _ancestors(reducer, node, depth)
        if grown == reached:  # the cone stops growing (units closed: a DQ's Q adds no hop)
            break
        reached = grown
        if whole(grown) == cone:
            continue
        cone = whole(grown)
        if reducer.smaller(cone) and reducer.test(cone):
            reducer.accept(cone, f"the node the engine's message names, with its inputs' producers ({depth} hops)")
            return True
    return False


def _ancestors(reducer, node: int, depth: int) -> frozenset:
    index, best = reducer.index, reducer.best
    found, frontier = {node}, {node}
    for _ in range(depth):
        frontier = {index.producer[t] for i in frontier for t in index.node_inputs[i]
                    if t in index.producer and index.producer[t] in best} - found
        if not frontier:
            break
        found |= frontier
    return frozenset(found)
