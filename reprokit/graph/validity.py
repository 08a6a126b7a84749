"""Is the user's model a valid graph? onnx's checker on the file, and the one judgement reprokit
adds to it: a graph that is broken (a cycle, a tensor defined twice, a name nothing defines) is
refused as the user's input, while what the checker dislikes but engines still run (nodes out of
order, an op it has no schema for: a TensorRT plugin, a custom op) is left to the engines, whose
failure is a verdict. Must not change the graph or run an engine.
"""

from __future__ import annotations

from reprokit.errors import InputError


def check_valid(model, path: str) -> None:
    """onnx's checker on the user's file: an invalid model (a cycle, a tensor defined twice, a
    node reading a name nothing defines) is an InputError naming ``path``, before any engine runs
    and says it on reprokit's copy. Only a broken graph is refused: nodes merely out of order (engines
    sort them) or an op the checker has no schema for (a TensorRT plugin, a custom op) are left to
    the engines, whose failure is a verdict."""
    import onnx

    try:
        onnx.checker.check_model(path)
    except onnx.checker.ValidationError as exc:
        text = str(exc).strip()
        if _sortable(model.graph) and not _defined_twice(model.graph):
            return  # out of order, or a node schema the checker does not know (a plugin op): engines judge it
        first = " ".join(text.split())[:300]
        raise InputError(
            f"{path} is not a valid ONNX model: onnx's checker says: {first}",
            hint="fix the export (onnx.checker.check_model(path) shows the same)",
        ) from exc


def _defined_twice(graph) -> bool:
    """A tensor two nodes produce, a node output that shadows an input or weight, or an output
    listed twice."""
    seen = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for name in node.output:
            if name and name in seen:
                return True
            seen.add(name)
    outputs = [o.name for o in graph.output]
    return len(outputs) != len(set(outputs))


def _sortable(graph) -> bool:
    """Can the top-level nodes be put in an order where every input is defined first (no cycle,
    no undefined name)?
    Kahn's algorithm over the tensors the nodes produce."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    produced = {o for node in graph.node for o in node.output}
    if any(i not in known and i not in produced for node in graph.node for i in node.input):
        return False  # a name nothing defines: no order helps
    missing = [{i for i in node.input if i not in known and i in produced} for node in graph.node]
    readers: dict[str, list[int]] = {}
    for k, names in enumerate(missing):
        for name in names:
            readers.setdefault(name, []).append(k)
    ready = [k for k, names in enumerate(missing) if not names]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for name in graph.node[k].output:
            for reader in readers.pop(name, ()):
                missing[reader].discard(name)
                if not missing[reader]:
                    ready.append(reader)
    return done == len(graph.node)
