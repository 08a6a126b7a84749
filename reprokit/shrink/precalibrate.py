"""A numeric check command's first call: the pack calibration that is also the confirmation.

A check command that names ``{outputs}`` can write what the model computed, so its packs are
judged member by member, as a built-in engine's are. Its calibration pack (the Identity probe,
then the whole original: ``passfail.calibrate``) runs before the confirming call, and the
original's outputs read from it are the confirming judgement: one call answers "does it
diverge" and "does this check judge every member of a pack". The probe's own outputs are judged
too: a check that passes it while failing the original depends on the model (no Identity probe
call later, ``confirm.probe_pending``). Where the pack tells nothing about the original (the
check refused it as a whole, wrote too few outputs, or the original agreed inside it), the
original is judged alone as before, and the calibration's answer is already known: no call twice.

Owns only that first call and what it proves; the confirming rules stay in ``confirm.py``, the
calibration's words in ``passfail.py``. Must not judge candidates.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from reprokit.engine.bug import NUMERIC
from reprokit.engine.worker import WorkerResult
from reprokit.graph.extract import Extraction
from reprokit.graph.io import save_model
from reprokit.graph.pack import build_pack
from reprokit.shrink.buildcost import heavy_layers
from reprokit.shrink.confirm import PROBE_FEEDS, probe_model
from reprokit.shrink.passfail import group_calibration, refused_whole, too_few_outputs
from reprokit.spec import parse_target


@dataclass(frozen=True)
class Precalibrated:
    """What the calibration pack run before the confirmation showed."""

    original: object | None  # the original's Verdict as the pack's second member; None: not read
    why: str | None  # None: the check judges every member of a pack (for a numeric signature)
    pack_verdict: object  # the pack's Verdict as a whole (a pass/fail calibration reads it)
    nodes: int
    seconds: float
    heavy: int = 0  # its heavy layers (buildcost.heavy_layers)

    def confirms(self) -> bool:
        """Is the original's verdict inside the pack a numeric divergence (the confirmation)?"""
        return (
            self.original is not None and self.original.diverges and self.original.kind in NUMERIC
        )


def wanted(run, *, pack: bool, resume: bool, weights_fit: bool) -> bool:
    """A check command that can write outputs (its command names ``{outputs}``), packs on, a
    fresh run of one input sample without opened control flow, weights that fit twice."""
    spec = parse_target(run.target)
    return (
        spec.engine == "cmd"
        and "{outputs}" in (spec.command or "")
        and pack
        and not resume
        and weights_fit
        and not run.levels
        and not run.prepared.samples
    )


def precalibrate(run, graph_outputs: dict, clock=None) -> Precalibrated:
    """One call: the Identity probe, then the original, in one pack; the original judged from
    its own outputs against the captured reference. ``clock``: timed as the calibrate step."""
    if clock is not None:
        clock.begin("calibrate")
    try:
        return _precalibrate(run, graph_outputs)
    finally:
        if clock is not None:
            clock.begin("confirm")


def as_calibration(run, reducer, pre: Precalibrated) -> tuple:
    """The calibration made before the confirmation, as ``passfail.calibrate_packs`` reads it
    (why not packed, nodes built, seconds, the pack's verdict for a pass/fail signature); its call
    moves from the confirm step's count to the calibrate step's."""
    group = reducer.packing == "group"
    stats = reducer.stats["confirm"]
    stats.calls, stats.seconds = stats.calls - 1, max(0.0, stats.seconds - pre.seconds)
    stats.nodes_built = stats.heavy_built = stats.light_calls = stats.light_nodes = 0
    stats.note_built(len(run.model.graph.node), heavy_layers(run.model), calls=stats.calls)
    if pre.confirms():
        reducer.confirmed = "the calibration pack, its second member (after the Identity probe)"
    why = group_calibration(reducer, pre.pack_verdict) if group else pre.why
    return why, pre.nodes, pre.seconds, pre.pack_verdict if group else None, pre.heavy


def _precalibrate(run, graph_outputs: dict) -> Precalibrated:
    model = run.given if run.given is not None else run.model
    probe = Extraction(probe_model(run.model), dict(PROBE_FEEDS), ["y"])
    original = Extraction(model, dict(run.feeds), list(graph_outputs))
    # node names kept (the two are disjoint): a pass/fail check reads the same names as alone
    pack = build_pack(
        [probe, original],
        keep_node_names=True,
        same_node_names=parse_target(run.target).has("fp32-nodes"),
    )
    path = save_model(
        pack.model, os.path.join(run.models_dir, "calibration.onnx"), base_dir=run.prepared.base_dir
    )
    run.event("calibrate: one call judges the original inside a pack, after the Identity probe")
    start = time.monotonic()
    try:
        result = run.oracle.run_target(path, pack.feeds)
    finally:
        os.remove(path)
    seconds = time.monotonic() - start
    try:
        whole = run.oracle.verdict_from(result, {})
        if result.status != "ok":
            return Precalibrated(
                None, refused_whole(result), whole, pack.nodes, seconds, heavy_layers(pack.model)
            )
        mine = [_member_outputs(result, member) for member in pack.members]
        if any(
            set(outputs) != set(member.outputs.values())
            for outputs, member in zip(mine, pack.members)
        ):
            return Precalibrated(
                None,
                too_few_outputs(result, pack),
                whole,
                pack.nodes,
                seconds,
                heavy_layers(pack.model),
            )
        run.oracle.verdict_from(
            _own(result, mine[0]), {"y": PROBE_FEEDS["x"]}
        )  # passing counts (probe_pending)
        verdict = run.oracle.verdict_from(_own(result, mine[1]), graph_outputs)
        why = (
            None
            if verdict.diverges and verdict.kind in NUMERIC
            else (f"the failing model, second in a pack, gave {verdict.signature.describe()}")
        )
        return Precalibrated(verdict, why, whole, pack.nodes, seconds, heavy_layers(pack.model))
    finally:
        result.discard()


def _member_outputs(result, member) -> dict:
    return {
        original: result.outputs[packed]
        for packed, original in member.outputs.items()
        if packed in result.outputs
    }


def _own(result, outputs: dict) -> WorkerResult:
    return WorkerResult("ok", outputs=outputs, meta=result.meta, seconds=result.seconds)
