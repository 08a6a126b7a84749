"""Reference vs target → :class:`Verdict` with a :class:`Signature`; the verdict cache.

The signature (kind, affected outputs, normalized detail) is what shrink holds fixed, so a
reduction never slips to a different bug. What a verdict is lives in ``verdict.py`` (its names
are importable from here too); this module runs the engines and makes verdicts. Engine calls go
through ``worker.run_in_worker``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from reprokit.engine.digest import feeds_digest, file_digest  # noqa: F401  (re-exported: callers' import)
from reprokit.engine.memorybound import out_of_memory
from reprokit.engine.messages import _last_lines, normalize_message, quote_message  # noqa: F401  (re-exported)
from reprokit.engine.tensorfile import save_job_feeds, stable_key
from reprokit.engine.verdict import NUMERIC, Kind, Signature, Verdict
from reprokit.engine.worker import WorkerResult, run_in_worker
from reprokit.errors import EngineUnavailable, ExitCode, ReferenceFailure, ReprokitError
from reprokit.standalone.compare import (
    Criterion,
    compare_arrays,
    reference_sums,
    widen,
)


@dataclass
class CallStats:
    target: int = 0
    reference: int = 0
    cached: int = 0
    agreed: int = 0  # target verdicts that agreed (a check that passed): the check depends on the model
    target_seconds: float = 0.0
    reference_seconds: float = 0.0
    build_seconds: list = field(default_factory=list)  # per engine build, where the engine says
    feeds_seconds: float = 0.0  # writing the feeds' .npz for the workers (bookkeeping, not engine)


class Oracle:
    """Judges models: runs the reference and the target in workers and compares their outputs."""

    def __init__(
        self,
        reference: str,
        target: str,
        criterion: Criterion,
        *,
        precision: str,
        timeout: float = 600.0,
        policy=None,
        workdir: str | None = None,
        target_env: dict[str, str] | None = None,
    ):
        self.reference = reference
        self.target = target
        self.criterion = criterion
        self.precision = precision
        self.timeout = timeout
        self.policy = policy  # reprokit.standalone.checkpolicy.CheckPolicy of a cmd target, or None
        self.target_env = target_env
        self.build_only = False  # shrink sets it while hunting a build error
        self.quant = None  # engine/quantized.QuantPolicy of a quantized model: tensors judged in steps
        self.ignore: dict[str, np.ndarray] = {}  # --ignore-positions: output -> True where left out (``left_out``)
        self.weights_dir: str | None = None  # external data of the models judged, if any
        # --reference-model: the file the target runs for a model the reference runs (the
        # user's converted twin of that cut: reprokit.convert.twin); None: the same file
        self.target_model = None
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="reprokit-")
        self.workdir = workdir or self._tmp.name
        os.makedirs(self.workdir, exist_ok=True)
        self.stats = CallStats()
        self._cache: dict[str, Verdict] = {}
        self._reference_sums: dict[tuple, tuple[float, float]] = {}  # stable_key -> reference_sums
        # shrink keeps every verdict on disk (``remember``) and gives them back on --resume
        # (``recall``): a call judged before an interrupt is not made, nor charged, again
        self.remember = None
        self._pending: dict[str, threading.Event] = {}  # keys being computed right now
        self._counter = 0
        self._lock = threading.Lock()  # shrink --jobs N calls judge() from several threads

    def _job_dir(self, label: str) -> str:
        with self._lock:
            self._counter += 1
            return os.path.join(self.workdir, f"{self._counter:05d}-{label}")

    def _feeds_file(self, job_dir: str, feeds: dict[str, np.ndarray]) -> str:
        os.makedirs(job_dir, exist_ok=True)
        path = os.path.join(job_dir, "feeds.npz")
        start = time.monotonic()
        save_job_feeds(path, feeds)  # captured activations by reference
        with self._lock:
            self.stats.feeds_seconds += time.monotonic() - start
        return path

    def run_reference(self, model_path: str, feeds: dict, output_names=None) -> WorkerResult:
        """Reference outputs; a failure or non-finite reference raises ReferenceFailure."""
        job = self._job_dir("reference")
        result = run_in_worker(
            self.reference, model_path, self._feeds_file(job, feeds), job,
            output_names=output_names, timeout=self.timeout, weights_dir=self.weights_dir,
        )
        with self._lock:
            self.stats.reference += 1
            self.stats.reference_seconds += result.seconds
        _raise_for_environment(result, "reference")
        _raise_for_memory(result, "reference", self.reference)
        if result.status != "ok":
            result.discard()
            text = result.message or ""
            ir = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", text)
            if ir:
                raise ReferenceFailure(
                    f"the reference ({self.reference}) cannot load the model: IR version {ir.group(1)} is newer "
                    f"than this onnxruntime reads ({ir.group(2)})",
                    hint=f"re-save it with an older IR: m = onnx.load(p); m.ir_version = {ir.group(2)}; onnx.save(m, p2) "
                         "(or upgrade onnxruntime)")
            raise ReferenceFailure(
                f"the reference ({self.reference}) fails on this model: {result.status}: "
                f"{quote_message(text)}",
                hint=_old_opset_hint(model_path)
                or "reprokit needs a working reference; check the model with `polygraphy run MODEL --onnxrt`",
            )
        return result

    def run_target(self, model_path: str, feeds: dict, output_names=None) -> WorkerResult:
        job = self._job_dir("target")
        if self.target_model is not None:
            model_path = self.target_model(model_path)
        result = run_in_worker(
            self.target, model_path, self._feeds_file(job, feeds), job, output_names=output_names,
            timeout=self.timeout, policy=self.policy.to_json() if self.policy else None, env=self.target_env,
            build_only=self.build_only, weights_dir=self.weights_dir,
        )
        with self._lock:
            self.stats.target += 1
            self.stats.target_seconds += result.seconds
            if "build_seconds" in result.meta:
                self.stats.build_seconds.append(float(result.meta["build_seconds"]))
        _raise_for_environment(result, "target")
        return result

    def left_out(self, name: str, reference, target):
        """``target`` with the positions --ignore-positions leaves out of ``name`` set to the
        reference's values (they agree there); as it is where no mask names it or shapes differ."""
        mask = self.ignore.get(name)
        if mask is None or np.shape(reference) != np.shape(target):
            return target
        try:
            where = np.broadcast_to(mask, np.shape(target))
        except ValueError:
            return target
        return np.where(where, reference, target)

    def cache_key(self, model_path: str, feeds: dict, output_names=None) -> str:
        parts = [file_digest(model_path), feeds_digest(feeds), self.reference, self.target,
                 repr(self.criterion), repr(output_names), repr(self.policy), str(self.build_only),
                 str(self.quant is not None),
                 feeds_digest(self.ignore) if self.ignore else ""]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()

    def recall(self, key: str, verdict: Verdict) -> None:
        """A verdict an earlier process of this run judged (``remember``), for ``judge`` to answer."""
        with self._lock:
            self._cache.setdefault(key, verdict)

    def knows(self, model_path: str, feeds: dict, output_names=None) -> bool:
        """Would ``judge`` answer this from its cache (no target call)?"""
        return self.cache_key(model_path, feeds, output_names) in self._cache

    def judge(
        self,
        model_path: str,
        feeds: dict[str, np.ndarray],
        *,
        reference_outputs: dict[str, np.ndarray] | None = None,
        output_names: list[str] | None = None,
        keep_outputs: bool = False,
    ) -> Verdict:
        """Verdict for one model and feeds. Cached: an identical call is never run twice.
        ``keep_outputs``: a numeric divergence keeps the target's output values (``target_outputs``)."""
        key = self.cache_key(model_path, feeds, output_names)
        # One computation per key, even under --jobs: a second thread asking for the same model
        # waits for the first one's verdict instead of building the engine again.
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and keep_outputs and hit.target_outputs is None and hit.kind in NUMERIC:
                hit = None  # judged before without its values: once more, keeping them
            if hit is None:
                owner = key not in self._pending
                pending = self._pending.setdefault(key, threading.Event())
            else:
                self.stats.cached += 1
        if hit is not None:
            return Verdict(**{**hit.__dict__, "cached": True})
        if not owner:
            pending.wait()
            return self.judge(model_path, feeds, reference_outputs=reference_outputs, output_names=output_names,
                              keep_outputs=keep_outputs)
        try:
            verdict = self._judge_uncached(model_path, feeds, reference_outputs, output_names, keep_outputs)
            with self._lock:
                self._cache[key] = verdict
            if self.remember is not None:
                self.remember(key, verdict)
        finally:
            with self._lock:
                self._pending.pop(key, None)
            pending.set()
        return verdict

    def _judge_uncached(self, model_path, feeds, reference_outputs, output_names, keep_outputs=False) -> Verdict:
        reference_run = result = None
        try:  # every call's folder goes, whatever the outcome: crash hunts leave no feeds behind
            if reference_outputs is None:
                reference_run = self.run_reference(model_path, feeds, output_names)
                reference_outputs = reference_run.outputs
                check_reference_finite(reference_outputs, self.reference)
            result = self.run_target(model_path, feeds, output_names)
            verdict = self.verdict_from(result, reference_outputs, keep_outputs=keep_outputs)
        finally:
            for run in (result, reference_run):
                if run is not None:
                    run.discard()
        return verdict

    def run_again(self, model_path: str, feeds: dict, reference_outputs: dict) -> Verdict:
        """A fresh target run of a model judged before (a replay: never the verdict cache)."""
        result = self.run_target(model_path, feeds)
        try:
            return self.verdict_from(result, reference_outputs)
        finally:
            result.discard()

    def _sums_of(self, reference) -> tuple[float, float] | None:
        """``reference_sums`` of a float32 captured activation, computed once a run: a survey's
        tensors are judged again in every later step's packs (their bytes never change)."""
        if getattr(reference, "dtype", None) != np.float32:
            return None
        key = stable_key(reference)
        if key is None:
            return None
        sums = self._reference_sums.get(key)
        if sums is None:
            sums = self._reference_sums[key] = reference_sums(reference)
        return sums

    def verdict_from(self, result: WorkerResult, reference_outputs: dict, *, keep_outputs: bool = False,
                     full: bool = True) -> Verdict:
        """The verdict of one target run against reference outputs. ``full=False`` (the members of
        a pack, hundreds per call) leaves out the numbers no verdict reads unless the criterion's
        metric needs them: cosine distance, allclose count, degenerate-reference note
        (``compare_arrays``); the signature and every output's error are the same either way."""
        base = dict(criterion=self.criterion, reference=self.reference, target=self.target,
                    precision=self.precision, target_meta=result.meta, seconds=result.seconds,
                    quantized=self.quant.describe() if self.quant is not None else "")
        # No verdict at the bound: the engine did not run the model here (a pack that hits it is
        # split by the evaluator, which never asks for its verdict)
        _raise_for_memory(result, "target", self.target)
        if result.status == "timeout":
            return Verdict(Signature(Kind.TIMEOUT, detail="timeout"), (), message=result.message, **base)
        if result.status == "crash":
            # A death by signal is that signal; any other death is its exit code and the last
            # words of the engine, so two different aborts are two different findings.
            code = re.search(r"code (-?\d+)", result.message)
            detail = result.meta.get("signal") or " | ".join(
                filter(None, [f"exit code {code.group(1)}" if code else "",
                              normalize_message(_last_lines(result.log))]))
            return Verdict(Signature(Kind.CRASH, detail=detail), (),
                           message=f"{result.message}\n{result.log}".strip(), **base)
        if result.status == "build-error":
            detail = result.meta.get("detail") or normalize_message(result.message)
            return Verdict(Signature(Kind.BUILD_ERROR, detail=detail), (), message=result.message, **base)
        errors = []
        missing = [n for n in reference_outputs if result.outputs and n not in result.outputs]
        if missing:
            return Verdict(Signature(Kind.BUILD_ERROR, tuple(missing), "target output missing"), (),
                           message=f"the target produced no output named {missing[0]!r}", **base)
        for name, ref in reference_outputs.items():
            if name in result.outputs:
                errors.append(compare_arrays(name, ref, self.left_out(name, ref, result.outputs[name]),
                                             self.criterion, full=full,
                                             reference_sums=None if full else self._sums_of(ref)))
        if self.quant is not None:  # a quantized model: outputs it quantizes judged in steps
            errors = self.quant.rejudge(errors, self.criterion)
        reshaped = [e for e in errors if e.shape_mismatch]
        if reshaped:  # an error of inf between arrays of other shapes says nothing: name the shapes
            shapes = "; ".join(f"{e.name!r}: target {list(e.target_shape)} vs reference {list(e.shape)}"
                               for e in reshaped[:4])
            return Verdict(Signature(Kind.MISMATCH, tuple(e.name for e in reshaped), "shape"), tuple(errors),
                           message=f"output shapes differ: {shapes}", **base)
        nonfinite = [e for e in errors if e.nonfinite_in_target_only]
        if nonfinite:
            nan = any(e.target_nan > e.reference_nan for e in nonfinite)
            inf = any(e.target_inf > e.reference_inf for e in nonfinite)
            detail = "nan+inf" if nan and inf else ("nan" if nan else "inf")
            signature = Signature(Kind.NONFINITE, tuple(e.name for e in nonfinite), detail)
        elif any(e.exceeds for e in errors):
            signature = Signature(Kind.MISMATCH, tuple(e.name for e in errors if e.exceeds))
        else:
            signature = Signature(Kind.AGREE)
            with self._lock:
                self.stats.agreed += 1
        kept = None
        if keep_outputs and signature.kind in NUMERIC:  # copies: the worker's files go with the call
            kept = {name: np.array(value) for name, value in result.outputs.items() if name in reference_outputs}
        return Verdict(signature, tuple(errors), message="", target_outputs=kept, **base)


OLDEST_OPSET = 7  # onnxruntime has no kernels for ai.onnx opsets before 7 (Add-6, BatchNormalization-6 ...)
UPGRADE_OPSET = 13


def _old_opset_hint(model_path: str) -> str | None:
    """How to upgrade a model whose ai.onnx opset onnxruntime no longer runs; None otherwise."""
    import onnx

    try:
        model = onnx.load(model_path, load_external_data=False)
    except Exception:  # the engine's own message says what is wrong with the file
        return None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= OLDEST_OPSET:
        return None
    copy = os.path.splitext(model_path)[0] + f".opset{UPGRADE_OPSET}.onnx"
    return (f"the model uses opset {opset}, older than onnxruntime runs ({OLDEST_OPSET}); convert a copy and check "
            f"that: python -c \"import onnx; from onnx import version_converter; onnx.save(version_converter."
            f"convert_version(onnx.load({model_path!r}), {UPGRADE_OPSET}), {copy!r})\"")


def check_reference_finite(outputs: dict[str, np.ndarray], reference: str) -> None:
    """A NaN in the reference is no value to compare with: refused (exit 5). A ±inf is a value
    (a ``-inf`` attention mask, a constant that holds one): compared exactly there
    (``compare_arrays``: the same inf agrees, anything else is an infinite error) and warned
    about in the verdict (``reference_warnings``)."""
    for name, value in outputs.items():
        array = widen(value) if isinstance(value, np.ndarray) else np.asarray(value)
        if array.dtype.kind == "f" and np.isnan(array).any():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise ReferenceFailure(
                f"the reference ({reference}) itself gives {bad} NaN/Inf values in output {name!r}",
                hint="that is not a target divergence: check the inputs (--inputs, --val-range) or the model",
            )


def _raise_for_memory(result: WorkerResult, role: str, spec: str) -> None:
    """A call whose engine ran out of its memory bound (engine/memorybound.py) is no verdict."""
    if result.status != "memory":
        return
    result.discard()
    raise out_of_memory(role, spec, result.message, int(result.meta.get("bound", 0)))


def _raise_for_environment(result: WorkerResult, role: str) -> None:
    if result.status in ("unavailable", "error"):
        result.discard()  # the run stops here: nobody else will free the call's folder
    if result.status == "unavailable":
        raise EngineUnavailable(f"{role} engine unavailable: {result.message}", hint=result.hint)
    if result.status == "error":
        error = ReprokitError(result.message, hint=result.hint,
                              exit_code=ExitCode(result.exit_code or ExitCode.INPUT))
        if error.exit_code is ExitCode.INTERNAL and result.log:
            # The worker's traceback, chained so that --debug prints it and the Hint line does not.
            raise error from RuntimeError(f"engine worker traceback:\n{result.log}")
        raise error
