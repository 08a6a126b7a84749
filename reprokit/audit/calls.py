"""The audit's ledger of engine calls: every reference and target call, what it was for, what
it cost. The range audit adds nothing here: it reads the one reference capture."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Call:
    step: str  # capture, verdict, layerwise, sweep, explain
    role: str  # reference or target
    spec: str
    what: str
    seconds: float
    status: str = "ok"

    def to_json(self) -> dict:
        out = asdict(self)
        out["seconds"] = round(self.seconds, 3)
        return out


@dataclass
class Ledger:
    calls: list[Call] = field(default_factory=list)

    def add(self, step: str, role: str, spec: str, what: str, seconds: float, status: str = "ok") -> None:
        self.calls.append(Call(step, role, spec, what, float(seconds), status))

    def run(self, step: str, role: str, oracle, what: str, model_path: str, feeds: dict, output_names=None):
        """One reference or target call through ``oracle``, recorded even when it raises."""
        import time

        start = time.monotonic()
        spec = oracle.reference if role == "reference" else oracle.target
        call = oracle.run_reference if role == "reference" else oracle.run_target
        try:
            result = call(model_path, feeds, output_names)
        except Exception as exc:
            self.add(step, role, spec, what, time.monotonic() - start, type(exc).__name__)
            raise
        self.add(step, role, spec, what, time.monotonic() - start, result.status)
        return result

    def count(self, role: str, step: str | None = None) -> int:
        return sum(1 for c in self.calls if c.role == role and (step is None or c.step == step))

    def seconds(self, role: str | None = None, step: str | None = None) -> float:
        return sum(c.seconds for c in self.calls
                   if (role is None or c.role == role) and (step is None or c.step == step))

    def summary(self) -> dict:
        steps = list(dict.fromkeys(c.step for c in self.calls))
        return {
            "target_calls": self.count("target"),
            "reference_calls": self.count("reference"),
            "seconds": round(self.seconds(), 3),
            "range_audit_target_calls": 0,
            "by_step": {s: {"target": self.count("target", s), "reference": self.count("reference", s),
                            "seconds": round(self.seconds(step=s), 3)} for s in steps},
        }
