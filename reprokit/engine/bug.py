"""The ONE decision "shows the original bug", typed, and the causal test behind it for numeric bugs.

``judge`` returns a :class:`Judgement`: its :class:`Decision` says what held and which test decided
it — the verdict agrees, shows another bug (another failure class, or another message for a
build error or crash), is a much milder mismatch (the severity floor), looks like the bug and
does not cause it, or shows it (decided by the causal test, or by the signature only where no
values can be injected). Callers branch on the decision, never on words.

For numeric originals the causal test decides: the candidate's own target outputs, injected in
place of the same tensors into a reference run of the original model, must make the original's
failing outputs fail with the original kind (NaN stays NaN, Inf stays Inf; a mismatch stays a
mismatch). A node that is non-finite alone but whose value never reaches a failing output (a
Clip hides it, it lies on another path) looks like the bug and is not it; a node whose Inf ends
as a finite mismatch of the original (``Tanh(Exp(x) * 1e-6)``) is its cause, whatever its own
kind.

Owns the rule (``same_failure``, the kind and message rule) and the injected reference runs
(the reference engine only: never a target call). Must not build candidates, run passes or
count budgets.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import numpy as np

from reprokit.engine.oracle import Kind, Signature, feeds_digest
from reprokit.errors import ReprokitError
from reprokit.graph.extract import extract
from reprokit.graph.io import save_model
from reprokit.standalone.compare import compare_arrays

NUMERIC = (Kind.NONFINITE, Kind.MISMATCH)


class Decision(str, enum.Enum):
    """What one verdict is, held against the original's signature."""

    AGREES = "agrees"
    OTHER_BUG = "another bug"
    MILDER = "milder"
    NOT_CAUSAL = "not causal"
    CAUSAL = "shows it: causal test"
    SIGNATURE = "shows it: signature only"

    @property
    def shows(self) -> bool:
        return self in (Decision.CAUSAL, Decision.SIGNATURE)


@dataclass(frozen=True)
class Judgement:
    decision: Decision
    why: str = ""  # a few words for the journal and the findings ("outside the cone of y2")

    @property
    def shows(self) -> bool:
        return self.decision.shows

    def describe(self) -> str:
        return self.decision.value + (f" ({self.why})" if self.why else "")


def same_failure(original: Signature, other: Signature) -> bool:
    """The kind and message rule: the same failure class; for a build error or crash the same
    normalized message; a mismatch of shapes is another failure than a mismatch of values (an
    engine that returns an empty constant as a scalar is no int8 drift). Output names may differ
    (cut subgraphs)."""
    if original.kind != other.kind:
        return False
    if original.kind in (Kind.BUILD_ERROR, Kind.CRASH):
        return original.detail == other.detail
    if original.kind is Kind.MISMATCH:
        return (original.detail == "shape") == (other.detail == "shape")
    return True


def largest_error(verdict) -> float | None:
    """The largest metric error over the float outputs (exact outputs count differing elements,
    another unit: they never set or meet a severity floor)."""
    return max((o.error for o in verdict.outputs if not getattr(o, "exact", False)), default=None)


def judge(signature: Signature, verdict, *, severity: float | None = None, causal=None, nodes=None) -> Judgement:
    """Does ``verdict`` show the bug of ``signature``, and which test decided? The one place
    this is decided. ``causal``: the run's CausalTest (numeric signatures), ``nodes`` the
    candidate's node indices in the model the test injects into."""
    if not verdict.diverges:
        return Judgement(Decision.AGREES)
    injectable = causal is not None and signature.kind in NUMERIC and causal.applies
    # an Inf that ends as a finite mismatch of the original: its injection decides, not its kind
    crossing = injectable and signature.kind is Kind.MISMATCH and verdict.kind is Kind.NONFINITE
    if not same_failure(signature, verdict.signature) and not crossing:
        return Judgement(Decision.OTHER_BUG, verdict.signature.describe())
    error = largest_error(verdict)
    if severity is not None and error is not None and not error >= severity:
        return Judgement(Decision.MILDER, f"error below {severity:.3g}")
    if injectable:
        found = causal.test(verdict, nodes)
        if found is not None:
            return found
    if crossing:  # no values to inject (a cached verdict): the kinds differ, so it is not the bug
        return Judgement(Decision.OTHER_BUG, verdict.signature.describe())
    return Judgement(Decision.SIGNATURE)


def shows_bug(signature: Signature, verdict, *, severity: float | None = None, causal=None, nodes=None) -> bool:
    """``judge(...).shows``: for callers that need only the answer."""
    return judge(signature, verdict, severity=severity, causal=causal, nodes=nodes).shows


class _Injected:
    """The captured activations with some tensors replaced by the target's values."""

    def __init__(self, store, values: dict):
        self.store, self.values = store, values

    def __contains__(self, name: str) -> bool:
        return name in self.values or name in self.store

    def get(self, name: str) -> np.ndarray:
        return self.values[name] if name in self.values else self.store.get(name)

    def info(self, name: str):
        if name in self.values:
            return self.values[name].shape, self.values[name].dtype
        return self.store.info(name)


class CausalTest:
    """Injects a candidate's target outputs into the reference run of the original model.

    ``model``/``index``/``store``/``feeds`` are the run's model being reduced, its index, the
    captured reference activations and the original feeds; ``signature`` the original's. The
    test is cached by the injected values: a candidate judged twice costs one reference run."""

    def __init__(self, oracle, model, index, store, feeds: dict, signature: Signature, criterion, folder: str):
        self.oracle, self.model, self.index, self.store = oracle, model, index, store
        self.feeds, self.signature, self.criterion, self.folder = feeds, signature, criterion, folder
        self.failing = [o for o in signature.outputs if o in index.graph_outputs and o in store]
        self.cone: set[int] = set()
        for name in self.failing:
            if name in index.producer:
                self.cone |= index.ancestors(index.producer[name])
        self.runs = 0  # reference runs made for the test
        self.rejected = 0  # candidates that looked like the bug and did not cause it
        self._seen: dict[str, str | None] = {}

    @property
    def applies(self) -> bool:
        """False when the original's failing outputs are not outputs of the model reduced."""
        return bool(self.failing) and len(self.failing) == len(self.signature.outputs)

    def test(self, verdict, nodes=None) -> Judgement | None:
        """CAUSAL or NOT_CAUSAL; None when there is nothing to inject (the caller's signature
        rule decides)."""
        if not self.applies:
            return None
        if nodes is not None and not set(nodes) & self.cone:
            self.rejected += 1
            return Judgement(Decision.NOT_CAUSAL, "outside the cone of " + ", ".join(self.failing))
        values = getattr(verdict, "target_outputs", None)
        if not values:
            return None  # no values to inject (a cached verdict of another kind): the signature decides
        # only top-level tensors of the model injected into: a name inside a branch (or one the
        # model lacks) has no place to go, and the candidate is held to its signature instead
        injected = {n: self._as_reference(n, v) for n, v in values.items()
                    if n in self.store and n in self.index.producer}
        if not injected:
            return None
        key = feeds_digest(injected)
        if key not in self._seen:
            self._seen[key] = self._run(injected)
            if self._seen[key] is not None:
                self.rejected += 1
        why = self._seen[key]
        return Judgement(Decision.CAUSAL) if why is None else Judgement(Decision.NOT_CAUSAL, why)

    def _as_reference(self, name: str, value) -> np.ndarray:
        _, dtype = self.store.info(name)
        return np.asarray(value).astype(dtype, copy=False)

    def _run(self, injected: dict) -> str | None:
        """None when the injected run shows the original symptom on every failing output."""
        direct = {n: injected[n] for n in self.failing if n in injected}
        produced = {self.index.producer[n] for n in injected if n in self.index.producer}
        keep: set[int] = set()
        stack = [self.index.producer[n] for n in self.failing if n not in direct and n in self.index.producer]
        while stack:  # the failing outputs' cone, cut where a tensor is injected
            node = stack.pop()
            if node in keep or node in produced:
                continue
            keep.add(node)
            stack.extend(self.index.producer[t] for t in self.index.node_inputs[node]
                         if t in self.index.producer and t not in injected)
        outputs = dict(direct)
        if keep:
            # unchecked: the reference runs it at once and validates it itself; shape inference
            # and the checker on a cone of hundreds of nodes cost more than the run (issue 25)
            sub = extract(self.model, self.index, keep, _Injected(self.store, injected), feeds=self.feeds,
                          check=False)
            wanted = [n for n in self.failing if n not in direct]
            self.runs += 1
            try:
                outputs.update(self._reference_run(sub, wanted))
            except ReprokitError as exc:
                return f"the reference cannot run the original with these values ({exc.message[:120]})"
        return self._judge(outputs)

    def _reference_run(self, sub, wanted: list[str]) -> dict:
        """The reference's outputs of the injected model. The default reference (onnxruntime on
        the CPU) runs in this process: a worker per injection would cost more than the run."""
        external = any(t.data_location == 1 for t in sub.model.graph.initializer)  # TensorProto.EXTERNAL
        if self.oracle.reference == "ort" and not external:
            import onnxruntime as ort

            try:
                session = ort.InferenceSession(sub.model.SerializeToString(), providers=["CPUExecutionProvider"])
                values = session.run(wanted, sub.feeds)
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ReprokitError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from exc
            return dict(zip(wanted, values))
        path = save_model(sub.model, os.path.join(self.folder, f"causal-{self.runs}.onnx"))
        try:
            result = self.oracle.run_reference(path, sub.feeds, wanted)
        finally:
            os.remove(path)
        try:
            return {n: np.array(result.outputs[n]) for n in wanted if n in result.outputs}
        finally:
            result.discard()

    def _judge(self, outputs: dict) -> str | None:
        kinds: set[str] = set()
        for name in self.failing:
            if name not in outputs:
                return f"no value for {name}"
            reference = self.store.get(name)
            error = compare_arrays(name, reference, self.oracle.left_out(name, reference, outputs[name]), self.criterion)
            if getattr(self.oracle, "quant", None) is not None:  # a quantized model: judged in steps
                error = self.oracle.quant.rejudge([error], self.criterion)[0]
            if self.signature.kind is Kind.NONFINITE:
                if not error.nonfinite_in_target_only:
                    return f"{name} stays finite"
                kinds |= {"nan"} if error.target_nan > error.reference_nan else set()
                kinds |= {"inf"} if error.target_inf > error.reference_inf else set()
            elif not (error.exceeds or error.nonfinite_in_target_only):
                return f"{name} agrees ({error.error:.3g})"
        wanted = set(self.signature.detail.split("+")) if self.signature.kind is Kind.NONFINITE else set()
        if not wanted <= kinds:
            return f"{'+'.join(sorted(kinds))} where the original shows {self.signature.detail}"
        return None

    def report(self) -> dict:
        return {"reference_runs": self.runs, "rejected": self.rejected,
                **({} if self.applies else {"why": "the failing outputs are not outputs of the model reduced"})}


def tested_by(accepted: dict[str, int], final: str = "") -> str:
    """summary.no_slippage.test, counted: which test judged the accepted candidates (Decision
    values -> how many) and the final judgement; never what the run meant to hold."""
    used = {name for name, count in accepted.items() if count}
    if final:
        used.add(final.split(" (")[0])
    names = [words for decision, words in ((Decision.CAUSAL, "causal injection"), (Decision.SIGNATURE, "signature"))
             if decision.value in used]
    if len(used) > len(names):
        names.append("a pass's own inference")
    return " and ".join(names) if names else "none (no candidate was accepted)"
