"""A Verdict read back from the JSON it was written as (``Verdict.to_json``): what a resumed
shrink gives its oracle so that a call judged before an interrupt is not made again. Only the
fields ``to_json`` writes come back; the target's output values (kept for the causal test) do
not, so a judgement that needs them is made again. Runs no engine.
"""

from __future__ import annotations

from dataclasses import fields

from reprokit.engine.oracle import Kind, Signature, Verdict
from reprokit.standalone.compare import Criterion, OutputError

_FLOATS = {f.name for f in fields(OutputError) if f.type in ("float", float)}


def verdict_from_json(payload: dict, criterion: Criterion) -> Verdict:
    """``payload`` (``Verdict.to_json()``) as a Verdict judged under ``criterion`` (the run's:
    the oracle's cache key holds it, so a recalled verdict was judged under the same one)."""
    signature = payload["signature"]
    return Verdict(
        signature=Signature(
            Kind(signature["kind"]), tuple(signature["outputs"]), signature["detail"]
        ),
        outputs=tuple(_output(o) for o in payload["outputs"]),
        criterion=criterion,
        reference=payload["reference"],
        target=payload["target"],
        precision=payload["precision"],
        message=payload.get("message", ""),
        target_meta=dict(payload.get("target_meta") or {}),
        seconds=float(payload.get("seconds", 0.0)),
        cached=True,
    )


def _output(entry: dict) -> OutputError:
    known = {f.name for f in fields(OutputError)}
    values = {k: v for k, v in entry.items() if k in known}
    for name in _FLOATS & values.keys():
        values[name] = float(values[name])  # "inf" / "nan": JSON's spelling of non-finite floats
    values["shape"] = tuple(values["shape"])
    target_shape = values.get("target_shape")
    values["target_shape"] = (
        tuple(target_shape)
        if target_shape is not None and list(target_shape) != list(values["shape"])
        else None
    )
    return OutputError(**values)
