"""The library's entry points, the same objects the CLI uses: ``check`` a model against a target,
``shrink`` it to a minimal repro, ``pack`` a report archive, with the run's options
(:class:`RunOptions`). Knows nothing of click; raises ReprokitError subclasses only.

The work is done below — preparing and checking in :mod:`reprokit.engine.session` (the engine
wing's top, which shrink, audit and report build on; this module sits above them all, so they
cannot import it), shrinking in :mod:`reprokit.shrink.steps`, packing in
:mod:`reprokit.report.bundle`; ``check --layerwise`` adds shrink's isolated survey here.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from reprokit.engine import session, twinrun
from reprokit.engine.layerwise import divergence_start
from reprokit.engine.session import (
    CheckResult,
    Prepared,
    RunOptions,
    SampleVerdict,
    make_oracle,
    prepare,
)
from reprokit.graph.model import node_label
from reprokit.report.bundle import pack
from reprokit.shrink.pipeline import isolated_attribution
from reprokit.shrink.steps import ShrinkResult, shrink

__all__ = [
    "CheckResult",
    "Prepared",
    "RunOptions",
    "SampleVerdict",
    "ShrinkResult",
    "check",
    "make_oracle",
    "pack",
    "prepare",
    "shrink",
]


def check(model, target: str = "emulate:fp16", *, options: RunOptions | None = None,
          layerwise: bool = False, workdir: str | None = None) -> CheckResult:
    """Judge ``target`` against the reference on one model (:func:`reprokit.engine.session.check`);
    with ``layerwise``, also where the divergence starts, as audit and shrink say it."""
    result = session.check(model, target, options=options, layerwise=layerwise, workdir=workdir)
    if result.layerwise is not None:
        options = options or RunOptions()
        if result.quantized is not None and options.reference_model:  # the float model was the quantization's
            options = dataclasses.replace(options, reference_model=None)
        result.layerwise.start = _divergence_start(target, options, result, model)
    return result


def _divergence_start(target: str, options: RunOptions, result: CheckResult, model_path) -> dict:
    """Each node alone (one packed call, fed with the marked run's reference tensors) tells a node
    that diverges on its own from an error that only accumulates."""
    report, verdict, prepared = result.layerwise, result.verdict, result.prepared
    if not verdict.diverges or verdict.kind.value not in ("nonfinite", "mismatch") or not report.reference:
        return divergence_start(report, None)
    model = prepared.model
    with tempfile.TemporaryDirectory(prefix="reprokit-start-") as work:
        converted = os.fspath(model_path) if options.reference_model else None  # the target's model
        oracle = make_oracle(target, options, os.path.join(work, "calls"), target_model=converted)
        oracle.weights_dir = prepared.base_dir
        if converted:
            twinrun.attach(oracle, model, prepared.path, converted)
        found = isolated_attribution(model, dict(report.reference), prepared.feeds.arrays, oracle, verdict.signature,
                                     os.path.join(work, "isolated"), lambda i: node_label(model.graph.node[i], i))
    return {**divergence_start(report, found["diverging_nodes"]), "judged_alone": found["nodes_judged_alone"]}
