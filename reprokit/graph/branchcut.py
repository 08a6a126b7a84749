"""Candidates that reach inside ``If`` branches: every node of a model — those inside its If
branches, nested ones included — is a *site* a candidate keeps or removes. Graph surgery only.

A removed node's tensor that a kept node still reads must come from somewhere real. Inside the
branch the feeds take, it becomes an outer-scope name: a top-level graph input fed with the
activation captured on the opened model (:func:`reprokit.engine.activations.capture_opened`). Inside a branch the feeds do not take
nothing computes it, at capture or at run time: it is fed zeros of the type and shape shape
inference gives it (an If condition stays an input), or, shape unknown, the candidate is refused
before any engine call. An If output that no
kept node reads and whose producer is gone from a branch is dropped from the If node and from
both branches alike; an If left without outputs goes. Loop and Scan bodies stay as they are (a
tensor inside one has a value per iteration, no single activation stands for it).
Must not know about divergence: the Reducer judges what ``extraction`` builds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from reprokit.graph.extract import Extraction, extract
from reprokit.graph.index import (
    RANDOM,
    GraphIndex,
    bodies,
    has_bodies,
    iter_graphs,
    node_reads,
)

BRANCHES = ("then_branch", "else_branch")


@dataclass(frozen=True)
class Site:
    path: tuple  # ((position, branch), ...): the If branches around the node, outermost first
    position: int  # the node's position in its graph
    taken: bool  # does the reference run this node on these feeds


class Refused(Exception):
    """The candidate cannot be built from real values (said why)."""


class Sites:
    """The sites of ``model`` (pre-order: an If, then its branches' nodes), with the branch each
    If takes as ``store`` (activations of the opened model) says; ``feeds`` are the model's."""

    def __init__(self, model, store, feeds: dict):
        self.model, self.captured, self.feeds = model, store, feeds
        self.sites: list[Site] = []
        self.ids: dict[tuple, int] = {}
        self.taken_branch: dict[tuple, str | None] = {}
        self.aliases: dict[str, str] = {}  # a taken branch's output -> the If output that holds its value
        self.unrun: set[str] = set()  # names defined in branches the feeds do not take
        counts: dict[str, int] = {}
        _count_defined(model.graph, counts)
        self.ambiguous = {name for name, n in counts.items() if n > 1}
        self._walk(model.graph, (), True)
        self.inner_info = _inner_value_info(model)
        self.zeros = {name: spec for name in self.unrun if (spec := _static(self.inner_info.get(name)))}
        self.store = _View(store, self.aliases, self.zeros)
        self.constants: set[str] = set()  # depend on no graph input: a cut folds them, as extract does
        _constants(model.graph, {t.name for t in model.graph.initializer}, self.constants)
        self._memo: dict[frozenset, tuple] = {}

    def _walk(self, graph, path: tuple, taken: bool) -> None:
        for position, node in enumerate(graph.node):
            self.ids[(path, position)] = len(self.sites)
            self.sites.append(Site(path, position, taken))
            if node.op_type != "If":
                continue
            branch = self._branch(node) if taken else None
            self.taken_branch[(path, position)] = branch
            for attr in node.attribute:
                if attr.name not in BRANCHES:
                    continue
                runs = taken and branch == attr.name
                if runs:  # opening bound the branch's results to the If's outputs: same values
                    self.aliases.update((o.name, n) for o, n in zip(attr.g.output, node.output)
                                        if o.name not in self.captured and n in self.captured)
                else:
                    self.unrun.update(o for inner in attr.g.node for o in inner.output if o)
                self._walk(attr.g, path + ((position, attr.name),), runs)

    def _branch(self, node) -> str | None:
        cond = node.input[0]
        value = self.feeds.get(cond) if cond in self.feeds else (
            self.captured.get(cond) if cond in self.captured else None)
        if value is None:
            return None
        return "then_branch" if bool(np.asarray(value).reshape(-1)[0]) else "else_branch"

    @property
    def inside(self) -> int:
        """Sites inside If branches."""
        return sum(1 for s in self.sites if s.path)

    def cone(self, name: str) -> frozenset:
        """The sites tensor ``name`` depends on: its producer, what that reads, and through an
        If only the branch outputs of the If outputs needed (the rest go with their producers)."""
        producer: dict[str, tuple[int, int]] = {}  # tensor -> (site, output position)
        nodes = {}
        for number, site in enumerate(self.sites):
            graph = self.model.graph
            for position, branch in site.path:
                graph = next(a.g for a in graph.node[position].attribute if a.name == branch)
            node = nodes[number] = graph.node[site.position]
            for j, out in enumerate(node.output):
                if out:
                    producer.setdefault(out, (number, j))
        needed: set[int] = set()
        seen: set[str] = set()
        todo = [name]
        while todo:
            tensor = todo.pop()
            if tensor in seen or tensor not in producer:
                continue
            seen.add(tensor)
            number, j = producer[tensor]
            needed.add(number)
            node = nodes[number]
            if node.op_type == "If":
                todo.append(node.input[0])
                for attr in node.attribute:
                    if attr.name in BRANCHES and j < len(attr.g.output):
                        todo.append(attr.g.output[j].name)
            else:
                todo.extend(node_reads(node))
        for number in list(needed):  # the If nodes around a needed site
            path = self.sites[number].path
            for depth in range(len(path)):
                needed.add(self.ids[(path[:depth], path[depth][0])])
        return frozenset(needed)

    # -- candidates -------------------------------------------------------------------------

    def refused(self, keep: frozenset) -> str | None:
        return self._pruned(keep)[1]

    def extraction(self, keep, check: bool = True) -> Extraction:
        """The standalone model of the kept sites, fed like any cut: the model's own inputs, and
        captured activations for every tensor whose producer is gone (If conditions stay inputs)."""
        model, reason = self._pruned(frozenset(keep))
        if reason:
            raise Refused(reason)
        index = GraphIndex.build(model)
        index = dataclasses.replace(index, constants=index.constants | self.constants)
        for name, info in self.inner_info.items():
            index.value_info.setdefault(name, info)  # cut inside a branch: dims as the model knew them
        return extract(model, index, range(len(model.graph.node)), self.store, feeds=self.feeds, check=check)

    def _pruned(self, keep: frozenset) -> tuple:
        if keep not in self._memo:
            import onnx

            model = onnx.ModelProto()
            model.CopyFrom(self.model)
            try:
                self._prune(model.graph, (), True, keep, top=True)
                if not len(model.graph.node):
                    raise Refused("no node left")
                produced = {o for n in model.graph.node for o in n.output if o}
                outputs = [o for o in model.graph.output if o.name in produced]
                del model.graph.output[:]
                model.graph.output.extend(outputs)
                found = (model, None)
            except Refused as exc:
                found = (None, str(exc))
            if len(self._memo) > 8:
                self._memo.clear()
            self._memo[keep] = found
        return self._memo[keep]

    def _prune(self, graph, path: tuple, taken: bool, keep: frozenset, *, top: bool) -> set[str]:
        """Keep the sites in ``keep`` of ``graph`` (in place); the names it defined that are gone."""
        import onnx

        defined = {o for n in graph.node for o in n.output if o}
        kept, gone_in = [], {}
        for position, node in enumerate(graph.node):
            if self.ids[(path, position)] not in keep:
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            if copy.op_type == "If":
                gone_in[len(kept)] = {
                    attr.name: self._prune(attr.g, path + ((position, attr.name),),
                                           taken and self.taken_branch.get((path, position)) == attr.name, keep,
                                           top=False)
                    for attr in copy.attribute if attr.name in BRANCHES}
            kept.append(copy)
        own_outputs = set() if top else {o.name for o in graph.output}
        reads = set(own_outputs)
        for node in kept:
            reads.update(node_reads(node))
        survivors = []
        for position, node in enumerate(kept):
            if position in gone_in:
                if not _drop_outputs(node, gone_in[position], reads):
                    continue  # an If left without outputs
                for attr in node.attribute:
                    # onnxruntime refuses a branch whose output names a tensor from outside it
                    late = [o.name for o in attr.g.output if o.name in gone_in[position].get(attr.name, ())]
                    if attr.name in BRANCHES and late:
                        raise Refused(f"the branch's output {late[0]!r} would be a name from outside it")
            survivors.append(node)
        del graph.node[:]
        graph.node.extend(survivors)
        gone = defined - {o for n in survivors for o in n.output if o}
        reads = set(own_outputs)
        for node in survivors:
            reads.update(node_reads(node))
        for name in sorted((gone & reads) - own_outputs):  # the If around decides on its outputs
            if name in self.ambiguous:
                raise Refused(f"{name!r} names several tensors")
            if not taken and name not in self.zeros:
                raise Refused(f"a branch these feeds do not take reads {name!r}, whose producer is gone, "
                              "and its shape is not known")
            if taken and name not in self.store:
                raise Refused(f"no captured activation stands for {name!r}")
        return gone


def _drop_outputs(node, gone: dict, reads: set) -> bool:
    """Drop the If outputs nothing reads whose producer is gone from a branch, from the node and
    both branches alike. False when no output is left."""
    branches = {a.name: a.g for a in node.attribute if a.name in BRANCHES}
    drop = [j for j, name in enumerate(node.output)
            if name and name not in reads
            and any(j < len(g.output) and g.output[j].name in gone.get(b, ()) for b, g in branches.items())]
    for j in reversed(drop):
        del node.output[j]
        for graph in branches.values():
            if j < len(graph.output):
                del graph.output[j]
    return len(node.output) > 0


def _constants(graph, known: set, found: set) -> None:
    """Names of ``graph`` and its If branches computed from weights alone (Identity of a weight,
    Constant nodes): folded when cut, like the top-level constants of ``GraphIndex``."""
    known = known | {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "If":
            for body in bodies(node):
                _constants(body, known | found, found)
            continue
        if node.op_type in RANDOM or has_bodies(node):
            continue
        if all(i in known or i in found for i in node.input if i):
            found.update(o for o in node.output if o)


def _count_defined(graph, counts: dict) -> None:
    """How many times each name is defined in ``graph`` and its bodies (several: ambiguous)."""
    for scope in iter_graphs(graph):
        names = [i.name for i in scope.input] + [t.name for t in scope.initializer]
        for name in names + [o for node in scope.node for o in node.output if o]:
            counts[name] = counts.get(name, 0) + 1


def _inner_value_info(model) -> dict:
    """Types and shapes shape inference gives the tensors inside the model's bodies."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return {}
    found: dict = {}
    for scope in iter_graphs(inferred.graph):
        if scope is not inferred.graph:
            for info in scope.value_info:
                found.setdefault(info.name, info)
    return found


def _static(info) -> tuple | None:
    """(shape, numpy dtype) of a tensor whose type shape inference fully knows, else None."""
    from onnx import helper

    if info is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.HasField("shape"):
        return None
    dims = info.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims) or not info.type.tensor_type.elem_type:
        return None
    return tuple(d.dim_value for d in dims), helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)


class _View:
    """What a candidate's cuts read: the captured activations, a taken branch's output under its
    own name, and zeros for a tensor of a branch that does not run (never computed, never read
    at run time: the feeds do not take that branch)."""

    def __init__(self, captured, aliases: dict, zeros: dict):
        self.captured, self.aliases, self.zeros = captured, aliases, zeros

    def __contains__(self, name: str) -> bool:
        return name in self.captured or name in self.aliases or name in self.zeros

    def get(self, name: str):
        if name in self.captured:
            return self.captured.get(name)
        if name in self.aliases:
            return self.captured.get(self.aliases[name])
        shape, dtype = self.zeros[name]
        return np.zeros(shape, dtype)

    def info(self, name: str):
        if name in self.captured:
            return self.captured.info(name)
        if name in self.aliases:
            return self.captured.info(self.aliases[name])
        return self.zeros[name]


class Layered:
    """Two activation stores seen as one: the first wins."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __contains__(self, name: str) -> bool:
        return name in self.first or name in self.second

    def get(self, name: str):
        return self.first.get(name) if name in self.first else self.second.get(name)

    def info(self, name: str):
        return self.first.info(name) if name in self.first else self.second.info(name)
