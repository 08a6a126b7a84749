"""Shape shrinking: after the node reduction, the minimal model's inputs cut down — batch first,
then the last axes (spatial windows), then the others (channels) — while the signature holds.

A try slices every input that has the same size on the same axis, counted from the right as
broadcasting aligns them, to its first or its last half, and every initializer of that size on
that axis with it (a weight left whole would turn an elementwise product into a broadcast the
original never computed); an axis a Constant node's value also spans is not tried. It rewrites
the input's declared dims and drops shape facts that no longer hold; the reference runs on the try (a shape-dependent constant that no longer fits
makes the reference refuse it: that try simply fails) and the target judges it against that
reference. Numeric signatures judge every try of a round in one packed call and then try all
holding halvings at once; pass/fail signatures try all axes halved at once, one call each. The
result is judged alone before it replaces the node-minimal model; every call counts against the
run's budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from reprokit.engine.oracle import check_reference_finite
from reprokit.errors import ReferenceFailure
from reprokit.graph.extract import Extraction
from reprokit.graph.io import save_model
from reprokit.shrink.evaluator import Member, judge_member, judge_members
from reprokit.shrink.reducer import BudgetExhausted

MIN_ELEMENTS = 16  # inputs this small are left as they are


@dataclass
class ShapeTry:
    model: object
    feeds: dict
    outputs: list
    label: str
    change: tuple = ()  # (group, start, size): the slice that made it from its base
    windows: dict = field(default_factory=dict)  # input -> [start, size] per axis, in the node-minimal's feeds


def elements(feeds: dict) -> int:
    return int(sum(np.asarray(v).size for v in feeds.values() if isinstance(v, np.ndarray)))


def _groups(model, feeds: dict) -> list[list[tuple[str, int]]]:
    """Tensor axes that move together: every input and initializer with the same size at the same
    axis counted from the right (broadcasting's alignment). A group exists for an axis of an input
    of at least MIN_ELEMENTS; its partners join whatever their size. Batch first, then the last
    axes, then the rest. An axis that a Constant node's value spans too is left out: a crop could
    not move that value along."""
    inputs = [i.name for i in model.graph.input if i.name in feeds and isinstance(feeds[i.name], np.ndarray)]
    shapes = {name: feeds[name].shape for name in inputs}
    shapes.update({t.name: tuple(t.dims) for t in model.graph.initializer if t.name not in shapes})
    pinned = {(len(a.t.dims) - axis, int(d)) for node in model.graph.node if node.op_type == "Constant"
              for a in node.attribute if a.name == "value" for axis, d in enumerate(a.t.dims)}
    wanted: dict[tuple, int] = {}  # (offset from the right, size) -> rank of the input that asks
    for name in inputs:
        array = feeds[name]
        if array.size < MIN_ELEMENTS or array.dtype.kind not in "biuf":
            continue
        for axis, size in enumerate(array.shape):
            if size > 1 and (array.ndim - axis, size) not in pinned:
                wanted.setdefault((array.ndim - axis, size), array.ndim)
    found = {key: [(name, len(shape) - key[0]) for name, shape in shapes.items()
                   if len(shape) >= key[0] and shape[len(shape) - key[0]] == key[1]] for key in wanted}

    def order(key):
        offset, size = key
        rank = wanted[key]
        axis = rank - offset
        return (0 if axis == 0 else 1 if axis >= rank - 2 else 2, -size)

    return [found[k] for k in sorted(found, key=order)]


def _slice(base: ShapeTry, group: list, start: int, size: int, label: str) -> ShapeTry:
    model = onnx.ModelProto()
    model.CopyFrom(base.model)
    feeds = dict(base.feeds)
    windows = {name: [list(w) for w in box] for name, box in base.windows.items()}
    weights = {t.name: t for t in model.graph.initializer}
    for name, axis in group:
        if name in windows:
            windows[name][axis] = [windows[name][axis][0] + start, size]
        if name not in feeds:  # an initializer: the same window of it, in the model itself
            tensor = weights[name]
            cropped = np.take(numpy_helper.to_array(tensor), range(start, start + size), axis=axis)
            tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(cropped), name))
            continue
        feeds[name] = np.ascontiguousarray(np.take(feeds[name], range(start, start + size), axis=axis))
        info = next(i for i in model.graph.input if i.name == name)
        dim = info.type.tensor_type.shape.dim[axis]
        if dim.HasField("dim_value"):
            dim.dim_value = size
    del model.graph.value_info[:]  # inferred shapes of the old sizes
    for output in model.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    return ShapeTry(model, feeds, base.outputs, label, (tuple(group), start, size), windows)


def _halvings(current: ShapeTry, refused: set) -> list[ShapeTry]:
    tries = []
    for group in _groups(current.model, current.feeds):
        if _key(group) in refused:
            continue  # an axis the graph or the bug does not let shrink
        name, axis = group[0]
        size = current.feeds[name].shape[axis]
        half = size // 2
        what = ", ".join(f"{n}[axis {a}]" for n, a in group[:3])
        tries.append(_slice(current, group, 0, half, f"{what}: first {half} of {size}"))
        tries.append(_slice(current, group, size - half, half, f"{what}: last {half} of {size}"))
    return tries


def _key(group) -> tuple:
    """An axis group by its members, whatever their current size."""
    return tuple(sorted(group))


def _combine(current: ShapeTry, holding: list[ShapeTry]) -> ShapeTry | None:
    """Every holding halving of a different axis group applied at once (slices along different
    axes commute), or None when fewer than two groups hold."""
    picked: dict[tuple, ShapeTry] = {}
    for candidate in holding:
        picked.setdefault(candidate.change[0], candidate)
    if len(picked) < 2:
        return None
    combined = current
    for group, candidate in picked.items():
        combined = _slice(combined, list(group), candidate.change[1], candidate.change[2], "")
    combined.label = " + ".join(c.label for c in picked.values())
    return combined


def crop_key(attempt: ShapeTry) -> str:
    """A try's crop as the journal knows it: each input's window, per axis."""
    return ";".join(f"{name}:" + ",".join(f"{start}+{size}" for start, size in box)
                    for name, box in sorted(attempt.windows.items()))


class ShapeJudge:
    """Reference runs on tries, then the evaluator judges them (the only pack builder): one
    packed call for numeric signatures, one by one for pass/fail ones. Tries are candidates of
    the Reducer's current best (``nodes``) with a crop: journaled under the one key, counted
    against the run's budget (``calls_left``, None: no limit)."""

    def __init__(self, reducer, nodes: frozenset, folder: str, calls_left: int | None):
        self.reducer, self.nodes, self.folder, self.calls_left = reducer, frozenset(nodes), folder, calls_left
        self._spent = reducer.spent

    @property
    def packed(self) -> bool:
        return self.reducer.packing == "numeric"

    @property
    def calls(self) -> int:
        return self.reducer.spent - self._spent

    def can_call(self, reserve: int = 0) -> bool:
        return self.calls_left is None or self.calls + reserve < self.calls_left

    def _reference(self, attempt: ShapeTry, path: str) -> dict | None:
        try:
            result = self.reducer.oracle.run_reference(path, attempt.feeds, attempt.outputs)
        except ReferenceFailure:
            return None  # the graph does not take these shapes (a Reshape to a fixed size …)
        outputs = dict(result.outputs)
        result.discard()
        try:
            check_reference_finite(outputs, self.reducer.oracle.reference)
        except ReferenceFailure:
            return None
        return outputs

    def _member(self, attempt: ShapeTry, reference: dict) -> Member:
        return Member(self.nodes, Extraction(attempt.model, attempt.feeds, list(reference)), reference,
                      crop=crop_key(attempt))

    def judge(self, tries: list[ShapeTry]) -> list[bool]:
        """Which tries show the signature. Each try's reference runs on its own (a try the graph
        cannot take at its shapes drops out there, with no target call); the evaluator judges
        the rest within the budget."""
        found = [False] * len(tries)
        ready = []
        for number, attempt in enumerate(tries):
            path = save_model(attempt.model, os.path.join(self.folder, f"shape_try_{number}.onnx"))
            reference = self._reference(attempt, path)
            if reference is not None:
                ready.append((number, self._member(attempt, reference)))
        if not ready or not self.can_call():
            return found
        try:
            outcomes = judge_members(self.reducer, [member for _, member in ready])
        except BudgetExhausted:
            return found
        for (number, _), outcome in zip(ready, outcomes):
            found[number] = outcome is not None and outcome.interesting
        return found

    def alone(self, attempt: ShapeTry):
        """(interesting, verdict, reference) of one try judged alone; None if it cannot run."""
        if not self.can_call():
            return None
        path = save_model(attempt.model, os.path.join(self.folder, "shape_final.onnx"))
        reference = self._reference(attempt, path)
        if reference is None:
            return None
        try:
            outcome, verdict = judge_member(self.reducer, self._member(attempt, reference))
        except BudgetExhausted:
            return None
        return outcome.interesting, verdict, reference


def shrink_shapes(judge: ShapeJudge, model, feeds: dict, outputs: list, on_event=None) -> dict | None:
    """Halve input axes while the signature holds. Returns None when nothing shrank, else
    {"model", "feeds", "reference", "verdict", "report"}."""
    windows = {k: [[0, int(d)] for d in np.shape(v)] for k, v in feeds.items() if isinstance(v, np.ndarray)}
    windows.update({t.name: [[0, int(d)] for d in t.dims] for t in model.graph.initializer if t.name not in windows})
    whole = {k: [list(w) for w in box] for k, box in windows.items()}
    current = ShapeTry(model, dict(feeds), list(outputs), "", (), windows)
    before = elements(feeds)
    steps: list[str] = []
    refused: set = set()  # axis groups whose both halves failed: not tried again
    held: set = set()  # axis groups that held last round: halved together next round
    while judge.can_call(reserve=1):  # one call stays for judging the result alone
        if judge.packed:
            tries = _halvings(current, refused)
            if not tries:
                break
            together = _combine(current, [t for t in tries if t.change[1] == 0 and _key(t.change[0]) in held])
            tries += [together] if together is not None else []  # rides in the same call
            verdicts = judge.judge(tries)
            holding = [t for t, ok in zip(tries, verdicts) if ok]
            singles = [(t, ok) for t, ok in zip(tries, verdicts) if t is not together]
            held = {_key(t.change[0]) for t, ok in singles if ok}
            refused |= {_key(t.change[0]) for t, _ in singles} - held
            if not holding:
                break
            current = min(holding, key=lambda t: elements(t.feeds))
        else:
            groups = _groups(current.model, current.feeds)
            if not groups:
                break
            every = current
            for group in groups:
                name, axis = group[0]
                size = every.feeds[name].shape[axis]
                every = _slice(every, group, 0, size // 2, "")
            every.label = "every axis halved"
            if not judge.judge([every])[0]:
                break
            current = every
        steps.append(current.label)
        if on_event:
            on_event(f"shapes: {current.label} ({elements(current.feeds)} input elements)")
    if not steps:
        return None
    judged = judge.alone(current)
    if judged is None or not judged[0]:
        return None  # the last word is a single model: a packed "holds" is not enough
    _, verdict, reference = judged
    for output in current.model.graph.output:  # the written model declares its outputs' shapes again
        if output.name in reference and output.type.HasField("tensor_type"):
            shape = output.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.asarray(reference[output.name]).shape:
                shape.dim.add().dim_value = int(size)
    return {"model": current.model, "feeds": current.feeds, "reference": reference, "verdict": verdict,
            "report": {"input_elements_before": before, "input_elements_after": elements(current.feeds),
                       "steps": steps, "calls": judge.calls,
                       # which window of each node-minimal input (the captured activation) and
                       # of each weight that moved with it is kept
                       "windows": {k: w for k, w in current.windows.items() if w != whole[k]}}}
