"""Control flow opened for the reduction: each ``If`` replaced by the branch the feeds take, each
``Loop`` with a small known trip count unrolled, so capture, layerwise and every pass see the
nodes that were inside.

For the feeds of this run the opened model computes exactly what the original computes (the
branch taken and the trip count are read from a reference run), so it is a model of the same
program on these inputs; shrink still confirms the original as given and keeps the opened model
only when it shows the same divergence (an engine that fails only inside an ``If`` keeps its
wrapper). Graph surgery only: the caller runs the reference (``values``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reprokit.graph.extract import Extraction
from reprokit.graph.index import bodies, rename_outer_refs
from reprokit.standalone.names import FreshNames, graph_names

MAX_ROUNDS = 8  # nested control flow opens one level per round
MAX_UNROLL = 16  # a Loop with more iterations stays a Loop


def has_control_flow(model) -> bool:
    return any(n.op_type in ("If", "Loop") for n in model.graph.node)


def open_control_flow(model, values: Callable[[object, list[str]], dict]) -> list[tuple[object, list[str]]]:
    """Copies of ``model`` opened one level deeper each: its top-level ``If`` nodes inlined and
    small ``Loop`` nodes unrolled, as ``values(model, names)`` — top-level tensor values of a
    reference run on the run's feeds — says they run; then what that opened, and so on. Returns
    one (model, notes so far) per level, the deepest last; [] when nothing opens."""
    import onnx

    levels: list[tuple[object, list[str]]] = []
    notes: list[str] = []
    current = model
    for _ in range(MAX_ROUNDS):
        wanted = decisions(current)
        if not wanted:
            break
        known = values(current, sorted({t for node_index, tensors in wanted for t in tensors}))
        opened = onnx.ModelProto()
        opened.CopyFrom(current)
        changed = False
        # back to front: positions before the one rewritten stay valid
        for node_index, tensors in sorted(wanted, reverse=True):
            note = open_node(opened, node_index, known, tensors)
            if note:
                notes.append(note)
                changed = True
        if not changed:
            break
        current = opened
        levels.append((current, list(notes)))
    return levels


def open_node(model, node_index: int, known: dict, tensors: list[str]) -> str | None:
    """Open node ``node_index`` of ``model`` in place (inline an If's taken branch, unroll a small
    Loop) with the deciding ``tensors``' values from ``known``; the note, or None if it stays."""
    node = model.graph.node[node_index]
    if any(t not in known for t in tensors):
        return None
    if node.op_type == "If":
        taken = "then_branch" if bool(np.asarray(known[tensors[0]]).reshape(-1)[0]) else "else_branch"
        label = node.name or "an If"
        _inline_if(model, node_index, taken)
        return f"{label}: inlined its {taken.replace('_', ' ')} (the branch these feeds take)"
    if node.op_type == "Loop":
        trips = _trip_count(node, known, tensors)
        if trips is not None and trips <= MAX_UNROLL:
            label = node.name or "a Loop"
            _unroll_loop(model, node_index, trips)
            return f"{label}: unrolled its {trips} iterations (as these feeds run it)"
    return None


def decisions(model) -> list[tuple[int, list[str]]]:
    """Top-level If/Loop nodes that could open, and the tensors whose values decide how they run."""
    wanted = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "If":
            wanted.append((index, [node.input[0]]))
        elif node.op_type == "Loop" and not any(o for o in _scan_outputs(node)):
            # trip count M and condition (either may be empty); scan outputs stay a Loop
            wanted.append((index, [t for t in node.input[:2] if t]))
    return wanted


def _scan_outputs(node) -> list[str]:
    body = next(iter(bodies(node)))
    carried = len(node.input) - 2
    return list(node.output[carried:]) if len(body.output) - 1 > carried else []


def _trip_count(node, known: dict, tensors: list[str]) -> int | None:
    """Iterations the Loop runs: its M when the condition input is absent or true and the body
    passes its condition through unchanged (the common exporter pattern); otherwise unknown."""
    m_name, cond_name = node.input[0], node.input[1] if len(node.input) > 1 else ""
    if not m_name or m_name not in known:
        return None
    trips = int(np.asarray(known[m_name]).reshape(-1)[0])
    if cond_name:
        if not bool(np.asarray(known[cond_name]).reshape(-1)[0]):
            return 0
        body = next(iter(bodies(node)))
        if body.output[0].name != body.input[1].name:
            return None  # the body computes its own condition: the trip count is not M
    return max(0, trips)


def _pool_without(model, index: int) -> FreshNames:
    """Names the model uses outside the bodies of node ``index``."""
    graph = model.graph
    names = {vi.name for vi in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names.update(t.name for t in graph.initializer)
    for position, node in enumerate(graph.node):
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
        if position != index:
            for body in bodies(node):
                names |= graph_names(body)
    names.discard("")
    return FreshNames(names)


def _copy_body(body, pool: FreshNames, mapping: dict[str, str], prefix: str) -> tuple[list, list]:
    """Nodes and initializers of ``body`` with every name it defines made fresh in ``pool``
    (``mapping`` receives old -> new), references to names outside it left as they are."""
    import onnx

    defined = [t.name for t in body.initializer] + [o for n in body.node for o in n.output if o]
    for name in defined:
        if name not in mapping:
            mapping[name] = pool.fresh(name) if name in pool else name
            pool.take([mapping[name]])
    nodes = []
    for node in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [mapping.get(i, i) if i else i for i in copy.input]
        copy.output[:] = [mapping.get(o, o) if o else o for o in copy.output]
        if copy.name:
            copy.name = pool.fresh(f"{prefix}{copy.name}" if prefix else copy.name)
        for inner in bodies(copy):
            rename_outer_refs(inner, mapping, set())
        nodes.append(copy)
    inits = []
    for init in body.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = mapping[init.name]
        inits.append(copy)
    return nodes, inits


def _bind_outputs(nodes: list, results: list[str], targets: list[str], pool: FreshNames, label: str) -> list:
    """Make tensor ``results[j]`` appear under the name ``targets[j]``: by renaming its producer's
    output where it is made by ``nodes`` once, else by an Identity node. Returns extra nodes."""
    from onnx import helper

    produced = {o: node for node in nodes for o in node.output if o}
    counts: dict[str, int] = {}
    for name in results:
        counts[name] = counts.get(name, 0) + 1
    rename = {r: t for r, t in zip(results, targets) if t and r in produced and counts[r] == 1}
    for node in nodes:
        node.input[:] = [rename.get(i, i) for i in node.input]
        node.output[:] = [rename.get(o, o) for o in node.output]
        for inner in bodies(node):
            rename_outer_refs(inner, rename, set())
    extra = []
    for result, target in zip(results, targets):
        if target and result not in rename:
            extra.append(helper.make_node("Identity", [result], [target], name=pool.fresh(f"{label}/out")))
    return extra


def _inline_if(model, index: int, branch: str) -> None:
    node = model.graph.node[index]
    body = next(a.g for a in node.attribute if a.name == branch)
    pool = _pool_without(model, index)
    mapping: dict[str, str] = {}
    nodes, inits = _copy_body(body, pool, mapping, "")
    results = [mapping.get(o.name, o.name) for o in body.output]
    nodes += _bind_outputs(nodes, results, list(node.output), pool, node.name or "If")
    _replace(model, index, nodes, inits)


def _unroll_loop(model, index: int, trips: int) -> None:
    """Loop(M, cond, v_initial...) without scan outputs, body(i, cond, v...) -> (cond, v...):
    ``trips`` copies of the body in a row, iteration k reading iteration k-1's carried values."""
    from onnx import helper, numpy_helper

    node = model.graph.node[index]
    body = next(iter(bodies(node)))
    pool = _pool_without(model, index)
    label = node.name or "Loop"
    carried = list(node.input[2:])
    cond = node.input[1] if len(node.input) > 1 else ""
    nodes, inits = [], []
    for k in range(trips):
        mapping: dict[str, str] = {}
        counter = pool.fresh(f"{label}/iter{k}")
        inits.append(numpy_helper.from_array(np.array(k, np.int64), counter))
        mapping[body.input[0].name] = counter
        if len(body.input) > 1:
            if cond:
                mapping[body.input[1].name] = cond
            else:
                name = pool.fresh(f"{label}/cond{k}")
                inits.append(numpy_helper.from_array(np.array(True), name))
                mapping[body.input[1].name] = name
        for value, current in zip(body.input[2:], carried):
            mapping[value.name] = current
        step_nodes, step_inits = _copy_body(body, pool, mapping, f"{label}/iter{k}/")
        nodes += step_nodes
        inits += step_inits
        outs = [mapping.get(o.name, o.name) for o in body.output]
        cond = outs[0]
        carried = outs[1:]
    if trips == 0:
        carried = list(node.input[2:])
    nodes += [helper.make_node("Identity", [src], [dst], name=pool.fresh(f"{label}/out"))
              for src, dst in zip(carried, node.output) if dst]
    _replace(model, index, nodes, inits)


def _replace(model, index: int, nodes: list, inits: list) -> None:
    graph = model.graph
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend(kept[:index] + nodes + kept[index + 1:])
    graph.initializer.extend(inits)


def if_wrapper(model) -> str | None:
    """The condition tensor of the model's one top-level ``If`` (the exporter pattern "the whole
    network inside an If"), or None: only then can candidates be put back inside a wrapper."""
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    return ifs[0].input[0] if len(ifs) == 1 else None


def wrap_in_if(extraction, cond_name: str, cond_value):
    """``extraction`` (reprokit.graph.extract.Extraction) with all its nodes moved inside both branches
    of one ``If`` whose condition is fed with ``cond_value``: for an engine that fails only on
    what sits inside an If, a candidate keeps that context. Outputs keep their names."""
    import copy

    import onnx
    from onnx import helper

    sub = extraction.model
    pool = FreshNames.of(sub)
    cond = pool.fresh(cond_name or "cond")
    rename = {o.name: pool.fresh(f"{o.name}__branch") for o in sub.graph.output}
    body = onnx.GraphProto(name="reprokit_branch")
    for node in sub.graph.node:
        moved = onnx.NodeProto()
        moved.CopyFrom(node)
        moved.input[:] = [rename.get(i, i) for i in moved.input]
        moved.output[:] = [rename.get(o, o) for o in moved.output]
        for inner in bodies(moved):
            rename_outer_refs(inner, rename, set())
        body.node.append(moved)
    body.initializer.extend(sub.graph.initializer)
    for out in sub.graph.output:
        inner = onnx.ValueInfoProto()
        inner.CopyFrom(out)
        inner.name = rename[out.name]
        body.output.append(inner)
    value = np.asarray(cond_value).astype(bool)
    graph = helper.make_graph(
        [helper.make_node("If", [cond], [o.name for o in sub.graph.output], name=pool.fresh("reprokit_if"),
                          then_branch=body, else_branch=copy.deepcopy(body))],
        sub.graph.name or "reprokit_subgraph",
        list(sub.graph.input) + [helper.make_tensor_value_info(cond, onnx.TensorProto.BOOL, list(value.shape))],
        list(sub.graph.output))
    wrapped = helper.make_model(graph, opset_imports=list(sub.opset_import), ir_version=sub.ir_version,
                                producer_name="reprokit")
    wrapped.functions.extend(sub.functions)
    return Extraction(wrapped, {**extraction.feeds, cond: value}, list(extraction.outputs))
