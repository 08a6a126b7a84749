"""Reference runs for the evaluation layer: where a candidate's model is written, the reference's
outputs on many extractions in one packed run (split on a refusal), and the element of largest
error that shape tries centre on. Runs only the reference engine; judges no verdict."""

from __future__ import annotations

import os
import re
import uuid

import numpy as np

from reprokit.errors import ReferenceFailure
from reprokit.graph.pack import build_pack


def save_candidate(reducer, model) -> str:
    import onnx  # heavy: loaded once a call is made

    # A unique file per evaluation: threads never share one. External weights stay where
    # they are; the engines are told the folder (oracle.weights_dir).
    path = os.path.join(reducer.workdir, f"candidate-{uuid.uuid4().hex}.onnx")
    with reducer.tally.timing("write"):
        onnx.save(model, path)
    return path



def hotspot(outputs: dict, reference: dict):
    """(output, index, shape) of the element of largest error: the first non-finite one the
    reference does not share, else the largest absolute difference; None when nothing compares."""
    best = None
    for name, got in outputs.items():
        target, wanted = np.asarray(got), np.asarray(reference[name])
        if target.shape != wanted.shape or target.size == 0 or target.dtype.kind not in "biuf":
            continue
        target, wanted = target.astype(np.float64), wanted.astype(np.float64)
        fresh = ~np.isfinite(target) & np.isfinite(wanted)
        if fresh.any():
            score, flat = float("inf"), int(np.flatnonzero(fresh)[0])
        else:
            diff = np.abs(target - wanted).reshape(-1)  # flat: a 0-d output's difference is a scalar
            diff[~np.isfinite(diff)] = 0.0
            flat = int(np.argmax(diff))
            score = float(diff.flat[flat])
        if best is None or score > best[0]:
            best = (score, name, tuple(int(i) for i in np.unravel_index(flat, target.shape)), target.shape)
    return None if best is None else best[1:]


def reference_members(reducer, subs: list) -> list[dict | None]:
    """The reference's outputs on each extraction (its own feeds), or None where the reference
    cannot run it at its shapes: every one in one packed run, split in halves on a failure."""
    if not subs:
        return []
    if len(subs) == 1:
        path = save_candidate(reducer, subs[0].model)
        try:
            result = reducer.oracle.run_reference(path, subs[0].feeds, list(subs[0].outputs))
        except ReferenceFailure:
            return [None]
        finally:
            os.remove(path)
        try:
            return [{name: np.array(value) for name, value in result.outputs.items()}]
        finally:
            result.discard()
    with reducer.tally.timing("pack"):
        pack = build_pack(subs, keep_node_names=False)
    path = save_candidate(reducer, pack.model)
    try:
        result = reducer.oracle.run_reference(path, pack.feeds)
    except ReferenceFailure as exc:
        # the engine's message usually names the node that refused: its member goes, the rest
        # runs again; else halves
        named = re.search(r"\brk(\d+)/", str(exc))
        bad = int(named.group(1)) if named else -1
        if 0 <= bad < len(subs):
            rest = reference_members(reducer, subs[:bad] + subs[bad + 1:])
            return rest[:bad] + [None] + rest[bad:]
        half = len(subs) // 2
        return reference_members(reducer, subs[:half]) + reference_members(reducer, subs[half:])
    finally:
        os.remove(path)
    try:
        return [{original: np.array(result.outputs[name]) for name, original in member.outputs.items()}
                for member in pack.members]
    finally:
        result.discard()
