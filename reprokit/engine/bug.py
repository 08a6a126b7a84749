"""The ONE predicate "shows the original bug", and the causal test behind it for numeric bugs.

A verdict shows the original bug when it diverges with the original's signature (``Signature.
same_bug``: the kind, and the normalized message for build errors and crashes), when a mismatch
is not much milder than the original's (the severity floor), and — for numeric signatures, where
the candidate's own target outputs are known — when those outputs CAUSE the original symptom:
injected in place of the same tensors into a reference run of the original model, they make the
original's failing outputs fail with the original kind (NaN stays NaN, Inf stays Inf). A node
that is non-finite alone but whose value never reaches a failing output (a Clip hides it, it
lies on another path) looks like the bug and is not it.

Owns the rule and the injected reference runs (the reference engine only: never a target call).
Must not build candidates, run passes or count budgets.
"""

from __future__ import annotations

import os

import numpy as np

from reprokit.engine.oracle import Kind, Signature, feeds_digest
from reprokit.errors import ReprokitError
from reprokit.graph.extract import extract
from reprokit.graph.io import save_model
from reprokit.standalone.compare import compare_arrays

NUMERIC = (Kind.NONFINITE, Kind.MISMATCH)


def largest_error(verdict) -> float | None:
    """The largest metric error over the float outputs (exact outputs count differing elements,
    another unit: they never set or meet a severity floor)."""
    return max((o.error for o in verdict.outputs if not getattr(o, "exact", False)), default=None)


def why_not(signature: Signature, verdict, *, severity: float | None = None, causal=None,
            nodes=None) -> str | None:
    """None when ``verdict`` shows the bug of ``signature``; else why not, in a few words
    ("agree", "other signature", "milder mismatch …", "not causal: …")."""
    if not verdict.diverges:
        return "agree"
    if not signature.same_bug(verdict.signature):
        return "other signature"
    error = largest_error(verdict)
    if severity is not None and error is not None and not error >= severity:
        return f"milder mismatch (error below {severity:.3g})"
    if causal is not None and signature.kind in NUMERIC:
        return causal.why_not(verdict, nodes)
    return None


def shows_bug(signature: Signature, verdict, *, severity: float | None = None, causal=None, nodes=None) -> bool:
    """Does ``verdict`` show the original bug? The one place this is decided."""
    return why_not(signature, verdict, severity=severity, causal=causal, nodes=nodes) is None


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

    def why_not(self, verdict, nodes=None) -> str | None:
        if not self.applies:
            return None
        if nodes is not None and not set(nodes) & self.cone:
            self.rejected += 1
            return "not causal: outside the cone of " + ", ".join(self.failing)
        values = getattr(verdict, "target_outputs", None)
        if not values:
            return None  # no values to inject (a cached verdict of another kind): the signature decides
        injected = {n: self._as_reference(n, v) for n, v in values.items() if n in self.store}
        if not injected:
            return None
        key = feeds_digest(injected)
        if key not in self._seen:
            self._seen[key] = self._run(injected)
            if self._seen[key] is not None:
                self.rejected += 1
        return self._seen[key]

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
                return f"not causal: the reference cannot run the original with these values ({exc.message[:120]})"
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
                return f"not causal: no value for {name}"
            error = compare_arrays(name, self.store.get(name), outputs[name], self.criterion)
            if getattr(self.oracle, "quant", None) is not None:  # a quantized model: judged in steps
                error = self.oracle.quant.rejudge([error], self.criterion)[0]
            if self.signature.kind is Kind.NONFINITE:
                if not error.nonfinite_in_target_only:
                    return f"not causal: {name} stays finite"
                kinds |= {"nan"} if error.target_nan > error.reference_nan else set()
                kinds |= {"inf"} if error.target_inf > error.reference_inf else set()
            elif not (error.exceeds or error.nonfinite_in_target_only):
                return f"not causal: {name} agrees ({error.error:.3g})"
        wanted = set(self.signature.detail.split("+")) if self.signature.kind is Kind.NONFINITE else set()
        if not wanted <= kinds:
            return f"not causal: {'+'.join(sorted(kinds))} where the original shows {self.signature.detail}"
        return None

    def report(self) -> dict:
        return {"test": "causal injection" if self.applies else "signature",
                "reference_runs": self.runs, "rejected": self.rejected,
                **({} if self.applies else {"why": "the failing outputs are not outputs of the model reduced"})}
