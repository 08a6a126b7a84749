"""shapes: the node-minimal model's inputs cropped, in one packed call, to the smallest window that
keeps the signature — then that crop, judged alone, is the run's final judgement.

A ladder of crops around the element of largest error (where the last packed call that judged
the best saw it; the middle when none did): 1, 2, 4, … elements per axis, every axis together
and each axis alone, plus the smallest crop of every axis at once. Axes move in groups:
inputs that share a size at the same position counted from the last axis (numpy broadcasting
aligns there) are cut together, so broadcasting partners stay partners. A crop the graph cannot
take (a per-channel weight, a Reshape to a fixed size) is dropped before any target call: by
ONNX's strict shape inference, then by the reference, run once on a pack of every crop.

Numeric signatures judge every crop in one packed call (the evaluator builds it: the only pack
builder); the smallest that holds is returned first. Pass/fail signatures try only the smallest
crop (judged alone as the final: kept only if the same failure holds); a build error whose words
name no shape skips shapes. Must not judge a result: ``steps.py`` judges the crop alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from reprokit.engine.oracle import Kind, check_reference_finite
from reprokit.errors import ReferenceFailure
from reprokit.graph.extract import Extraction
from reprokit.graph.io import save_model
from reprokit.shrink.evaluator import judge_members
from reprokit.shrink.members import Member
from reprokit.shrink.reducer import BudgetExhausted
from reprokit.shrink.references import reference_members

MIN_ELEMENTS = 16  # inputs this small are left as they are

# Words of an engine's message that say a shape is involved: only then can a crop matter.
SHAPE_WORDS = re.compile(r"shape|dim|rank|size|broadcast|axis|axes|reshape|\d+\s*[x×]\s*\d+|\[\s*-?\d+\s*,",
                         re.IGNORECASE)


@dataclass
class ShapeTry:
    model: object
    feeds: dict
    outputs: list
    label: str
    windows: dict = field(default_factory=dict)  # input -> [start, size] per axis, in the node-minimal's feeds
    reference: dict | None = None  # the reference's outputs on this crop, once run
    weights_dir: str | None = None  # where the model's external weights are (a weight cropped is read from there)


def elements(feeds: dict) -> int:
    return int(sum(np.asarray(v).size for v in feeds.values() if isinstance(v, np.ndarray)))


def crop_key(attempt: ShapeTry) -> str:
    """A try's crop as the journal knows it: each input's window, per axis."""
    return ";".join(f"{name}:" + ",".join(f"{start}+{size}" for start, size in box)
                    for name, box in sorted(attempt.windows.items()))


def groups(model, feeds: dict) -> list[list[tuple[str, int]]]:
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


def _crop(base: ShapeTry, cuts: dict, label: str) -> ShapeTry:
    """``base`` with each group of ``cuts`` ({group: (start, size)}) sliced — inputs in the feeds,
    initializers in the model (a weight left whole would turn an elementwise product into a
    broadcast the original never computed); declared dims follow, shape facts that no longer
    hold are dropped."""
    model = onnx.ModelProto()
    model.CopyFrom(base.model)
    feeds = dict(base.feeds)
    windows = {name: [list(w) for w in box] for name, box in base.windows.items()}
    weights = {t.name: t for t in model.graph.initializer}
    for group, (start, size) in cuts.items():
        for name, axis in group:
            if name in windows:
                windows[name][axis] = [windows[name][axis][0] + start, size]
            if name not in feeds:  # an initializer: the same window of it, in the model itself
                tensor = weights[name]
                cropped = np.take(numpy_helper.to_array(tensor, base.weights_dir or ""), range(start, start + size),
                                  axis=axis)
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
    return ShapeTry(model, feeds, base.outputs, label, windows, weights_dir=base.weights_dir)


def centers(found: list, feeds: dict, hotspot) -> dict:
    """Each group's coordinate of the element of largest error: read off the output where it was
    seen when that output has the group's size at the same position from the last axis; the
    middle otherwise."""
    middle = {tuple(g): feeds[g[0][0]].shape[g[0][1]] // 2 for g in found}
    if hotspot is None:
        return middle
    _, index, shape = hotspot
    for group in found:
        name, axis = group[0]
        size = feeds[name].shape[axis]
        position = feeds[name].ndim - axis
        if position <= len(shape) and shape[len(shape) - position] == size:
            middle[tuple(group)] = int(index[len(shape) - position])
    return middle


def _size(base: ShapeTry, group) -> int:
    name, axis = group[0]
    return base.feeds[name].shape[axis]


def _window(center: int, size: int, full: int) -> tuple[int, int]:
    return min(max(center - size // 2, 0), full - size), size


def ladder(base: ShapeTry, found: list, middle: dict) -> list[ShapeTry]:
    """Every axis together at 1, 2, 4, … elements, and each group alone, around ``middle``."""
    full = {tuple(g): base.feeds[g[0][0]].shape[g[0][1]] for g in found}
    tries: dict[str, ShapeTry] = {}

    def add(cuts: dict, label: str) -> None:
        if cuts:
            attempt = _crop(base, cuts, label)
            tries.setdefault(crop_key(attempt), attempt)

    size = 1
    while size < max(full.values(), default=0):
        add({g: _window(middle[g], size, n) for g, n in full.items() if n > size}, f"every axis at {size}")
        size *= 2
    for group, n in full.items():
        what = ", ".join(f"{name}[axis {axis}]" for name, axis in group[:3])
        size = 1
        while size < n:
            add({group: _window(middle[group], size, n)}, f"{what}: {size} of {n}")
            size *= 2
    return list(tries.values())


def _takes(model) -> bool:
    """Does strict shape inference accept the crop? (False: it cannot run at these shapes.)"""
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # noqa: BLE001 - any inference error means "not at these shapes"
        return False
    return True


def smallest_of_each(base: ShapeTry, found: list, ready: list[ShapeTry], middle: dict) -> ShapeTry | None:
    """Each group at the smallest size one of its single-group crops runs at, all at once."""
    full = {tuple(g): base.feeds[g[0][0]].shape[g[0][1]] for g in found}
    cuts = {}
    for group, n in full.items():
        name, axis = group[0]
        sizes = [t.feeds[name].shape[axis] for t in ready if t.feeds[name].shape[axis] < n]
        if sizes:
            cuts[group] = _window(middle[group], min(sizes), n)
    return _crop(base, cuts, "every axis at its smallest") if len(cuts) > 1 else None


def _base(model, feeds: dict, outputs: list, weights_dir: str | None = None) -> ShapeTry:
    """The uncropped model as the ladder's base: every input and weight whole; ``weights_dir``:
    where its external weights are (the run's own weights file, or the user's)."""
    windows = {k: [[0, int(d)] for d in np.shape(v)] for k, v in feeds.items() if isinstance(v, np.ndarray)}
    windows.update({t.name: [[0, int(d)] for d in t.dims] for t in model.graph.initializer if t.name not in windows})
    return ShapeTry(model, dict(feeds), list(outputs), "", windows, weights_dir=weights_dir)


class Shapes:
    """The shapes pass over the Reducer's best: its crops prepared, checked by the reference, and
    judged by the evaluator, counted against the run's budget."""

    def __init__(self, reducer, nodes: frozenset, folder: str):
        self.reducer, self.nodes, self.folder = reducer, frozenset(nodes), folder

    def skips(self, message: str) -> bool:
        """A build error whose words name no shape: no crop can matter."""
        return self.reducer.signature.kind is Kind.BUILD_ERROR and not SHAPE_WORDS.search(message or "")

    def _referenced(self, tries: list[ShapeTry]) -> list[ShapeTry]:
        """The tries the reference runs at their shapes (finite), with its outputs attached."""
        runs = reference_members(self.reducer, [Extraction(t.model, t.feeds, list(t.outputs)) for t in tries])
        ready = []
        for attempt, outputs in zip(tries, runs):
            if outputs is None:
                continue
            try:
                check_reference_finite(outputs, self.reducer.oracle.reference)
            except ReferenceFailure:
                continue
            attempt.reference = outputs
            declare_output_shapes(attempt.model, outputs)  # a valid model for the target (onnx's checker)
            ready.append(attempt)
        return ready

    def _ladders(self, entries: list) -> list:
        """(key, crops) per (key, base, groups, centres) entry: an axis group whose one-element
        crop alone the reference refuses (a weight or a Reshape pins it) is left whole — one
        reference run on a pack of those probes for every entry at once — and strict shape
        inference drops the crops it rejects where it accepts the uncropped model."""
        probes = [(number, tuple(g), _crop(base, {tuple(g): _window(middle[tuple(g)], 1, _size(base, g))}, ""))
                  for number, (_, base, found, middle) in enumerate(entries) for g in found]
        runs = reference_members(self.reducer, [Extraction(t.model, t.feeds, list(t.outputs)) for *_, t in probes])
        pinned = {(number, g) for (number, g, _), out in zip(probes, runs) if out is None}
        out = []
        for number, (key, base, found, middle) in enumerate(entries):
            free = [g for g in found if (number, tuple(g)) not in pinned]
            crops = ladder(base, free, middle) if free else []
            if crops and _takes(base.model):
                crops = [t for t in crops if _takes(t.model)]
            out.append((key, crops))
        return out

    def member(self, attempt: ShapeTry) -> Member:
        return Member(self.nodes, Extraction(attempt.model, attempt.feeds, list(attempt.reference)),
                      attempt.reference, crop=crop_key(attempt))

    def known(self) -> list[ShapeTry]:
        """Crops of this best judged speculatively (riding in an earlier pack) that held."""
        held = []
        for attempt in self.reducer.crop_tries.get(self.nodes, []):
            outcome = self.reducer.cached(self.nodes, crop_key(attempt))
            if outcome is not None and outcome.interesting:
                held.append(attempt)
        return sorted(held, key=lambda t: elements(t.feeds))

    def speculate(self, regions: list) -> None:
        """The ladder of each (nodes, extraction, reference) region, centred on the middle, rides
        in the next packed call: the step that accepts one of them finds its crops judged."""
        entries = []
        for nodes, sub, reference in regions:
            found = groups(sub.model, sub.feeds)
            if found and elements(sub.feeds) > MIN_ELEMENTS:
                entries.append((frozenset(nodes), _base(sub.model, sub.feeds, list(reference), self.reducer.oracle.weights_dir), found,
                                centers(found, sub.feeds, None)))
        prepared = [(key, t) for key, crops in self._ladders(entries) for t in crops]
        if not prepared:
            return
        ready = self._referenced([t for _, t in prepared])
        by_id = {id(t) for t in ready}
        members = []
        for nodes, attempt in prepared:
            if id(attempt) in by_id:
                self.reducer.crop_tries.setdefault(nodes, []).append(attempt)
                members.append(Member(nodes, Extraction(attempt.model, attempt.feeds, list(attempt.reference)),
                                      attempt.reference, crop=crop_key(attempt)))
        self.reducer.also_judge_members(members)

    def tries(self, model, feeds: dict, outputs: list, hotspot=None) -> list[ShapeTry]:
        """Crops that hold, smallest first: for numeric signatures every ladder crop judged in one
        packed call; for pass/fail ones the smallest crop, unjudged (the caller's final call
        judges it alone). Empty when nothing can shrink or the budget is spent."""
        known = self.known()
        if known:  # crops of this best that rode along in an earlier packed call and held
            return known
        base = _base(model, feeds, outputs, self.reducer.oracle.weights_dir)
        found = groups(model, feeds)
        if not found:
            return []
        middle = centers(found, feeds, hotspot)
        ((_, candidates),) = self._ladders([(None, base, found, middle)])
        ready = self._referenced(candidates)
        extra = smallest_of_each(base, found, ready, middle)
        if extra is not None and crop_key(extra) not in {crop_key(t) for t in ready}:
            ready += self._referenced([extra])
        ready.sort(key=lambda t: elements(t.feeds))
        if not ready:
            return []
        if self.reducer.packing != "numeric":
            return ready[:1]
        try:
            # smallest first: packed by build cost, the crops after the first that holds are not built
            outcomes = judge_members(self.reducer, [self.member(t) for t in ready], stop_at_hit=True)
        except BudgetExhausted:
            return []
        return [t for t, o in zip(ready, outcomes) if o is not None and o.interesting]


def report(model, before_feeds: dict, chosen: ShapeTry, calls: int) -> dict:
    """summary.json's ``shapes`` (``model``: the node-minimal model the crop was cut from)."""
    whole = {k: [[0, int(d)] for d in np.shape(v)] for k, v in before_feeds.items()}
    whole.update({t.name: [[0, int(d)] for d in t.dims] for t in model.graph.initializer if t.name not in whole})
    return {"input_elements_before": elements(before_feeds), "input_elements_after": elements(chosen.feeds),
            "steps": [chosen.label], "calls": calls,
            # which window of each node-minimal input (the captured activation) and of each
            # weight that moved with it is kept
            "windows": {k: w for k, w in chosen.windows.items() if w != whole.get(k)}}


def declare_output_shapes(model, reference: dict) -> None:
    """The written model declares its outputs' shapes again (the crop cleared them)."""
    for output in model.graph.output:
        if output.name in reference and output.type.HasField("tensor_type"):
            shape = output.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.asarray(reference[output.name]).shape:
                shape.dim.add().dim_value = int(size)


def save_try(attempt: ShapeTry, folder: str, name: str) -> str:
    return save_model(attempt.model, os.path.join(folder, name))
