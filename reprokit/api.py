"""The library's entry points, the same objects the CLI uses: ``check`` a model against a target,
``shrink`` it to a minimal repro, ``pack`` a report archive, with the run's options
(:class:`RunOptions`). Knows nothing of click; raises ReprokitError subclasses only.

Only names: the work is done below — preparing and checking in :mod:`reprokit.engine.session`
(the engine wing's top, which shrink, audit and report build on; this module sits above them
all, so they cannot import it), shrinking in :mod:`reprokit.shrink.steps`, packing in
:mod:`reprokit.report.bundle`.
"""

from __future__ import annotations

from reprokit.engine.session import (
    CheckResult,
    Prepared,
    RunOptions,
    SampleVerdict,
    check,
    make_oracle,
    prepare,
)
from reprokit.report.bundle import pack
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
