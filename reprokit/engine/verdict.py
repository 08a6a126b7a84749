"""What a judgement is: the :class:`Kind` of a divergence, the :class:`Signature` that shrink
holds fixed (kind, affected outputs, normalized detail), and the :class:`Verdict` of one target
run against the reference (the signature, every output's error, the engine's own words), with
their JSON forms (verdict.json, summary.json).

Plain values only: must not run an engine or compare arrays (``oracle.py`` makes verdicts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from reprokit.standalone.compare import Criterion, OutputError, reference_warnings

__all__ = ["NUMERIC", "Kind", "Signature", "Verdict"]


class Kind(str, enum.Enum):
    AGREE = "agree"
    NONFINITE = "nonfinite"
    MISMATCH = "mismatch"
    BUILD_ERROR = "build-error"
    CRASH = "crash"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Signature:
    kind: Kind
    outputs: tuple[str, ...] = ()
    detail: str = ""  # nan/inf/nan+inf for nonfinite; normalized message for errors

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "outputs": list(self.outputs), "detail": self.detail}

    def describe(self) -> str:
        text = self.kind.value
        if self.detail:
            text += f" ({self.detail})"
        if self.outputs:
            text += " in " + ", ".join(self.outputs[:4]) + (" …" if len(self.outputs) > 4 else "")
        return text


@dataclass(frozen=True)
class Verdict:
    signature: Signature
    outputs: tuple[OutputError, ...]
    criterion: Criterion
    reference: str
    target: str
    precision: str
    message: str = ""  # the engine's own text for errors
    target_meta: dict = field(default_factory=dict, hash=False, compare=False)
    seconds: float = 0.0
    cached: bool = False
    # the target's own output values, kept only when asked (``keep_outputs``) for a numeric
    # divergence: what the causal test (bug.py) injects into the original's reference run
    target_outputs: dict | None = field(default=None, hash=False, compare=False, repr=False)
    quantized: str = (
        ""  # how a quantized model's tensors were judged (engine/quantized.py), else ""
    )

    @property
    def diverges(self) -> bool:
        return self.signature.kind is not Kind.AGREE

    @property
    def kind(self) -> Kind:
        return self.signature.kind

    @property
    def warnings(self) -> list[str]:
        """Outputs whose reference makes the metric say little (all zero, near zero, constant)."""
        return reference_warnings(self.outputs, self.criterion.metric)

    def worst(self) -> OutputError | None:
        return max(self.outputs, key=lambda o: (o.exceeds, o.error), default=None)

    def to_json(self) -> dict:
        return {
            "schema": "reprokit.verdict/1",
            "diverges": self.diverges,
            "signature": self.signature.to_json(),
            "reference": self.reference,
            "target": self.target,
            "precision": self.precision,
            "criterion": {
                "metric": self.criterion.metric.value,
                "tolerance": self.criterion.tolerance,
                "atol": self.criterion.atol,
                "rtol": self.criterion.rtol,
            },
            "outputs": [o.to_json() for o in self.outputs],
            **({"quantized": self.quantized} if self.quantized else {}),
            "warnings": self.warnings,
            "message": self.message,
            "target_meta": self.target_meta,
            "seconds": round(self.seconds, 3),
        }


# the kinds a numeric comparison finds (their target values can be kept and injected: bug.py)
NUMERIC = (Kind.NONFINITE, Kind.MISMATCH)
