"""shrink: confirm the divergence, capture reference activations, localize, reduce, and write
the minimal model with its real-activation feeds. Best-so-far results are rewritten after every
accepted step; ``resume`` replays the journal of candidate outcomes and continues.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from dataclasses import dataclass, field

import numpy as np

from reprokit.activations import ActivationStore
from reprokit.backends import backend_class
from reprokit.errors import InputError, NothingToReduce
from reprokit.layerwise import compare_marked_run, float_node_outputs
from reprokit.model import fold_constants, mark_outputs, save_model
from reprokit.oracle import Kind, check_reference_finite
from reprokit.reduce.passes import branches, ddmin, localize, window
from reprokit.reduce.reducer import BudgetExhausted, Journal, Reducer
from reprokit.session import RunOptions, make_oracle, prepare
from reprokit.spec import parse_target
from reprokit.subgraph import GraphIndex

STATE_DIR = ".reprokit"


@dataclass(frozen=True)
class Limits:
    """Resource bounds of a shrink run."""

    capture_chunk_bytes: int = 1 << 30  # activations one reference run may return at once
    max_activation_disk_bytes: int | None = None  # --max-activation-disk
    max_calls: int | None = -1  # target calls in all; -1 = auto (polygraphy parity), None = no limit


def auto_call_budget(nodes: int) -> int:
    """About what polygraphy's bisect spends on a graph of ``nodes``: log2 of the nodes for each
    end. Where localization settles a divergence reprokit needs far fewer; where it cannot, the
    window bisection still finishes (a few calls past this), and the finer passes get nothing."""
    return 2 * math.ceil(math.log2(nodes + 1))


@dataclass
class ShrinkResult:
    summary: dict
    out_dir: str
    minimal_path: str
    verdict: object
    notes: list[str] = field(default_factory=list)


def _atomic_json(path: str, payload: dict) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(payload, handle, indent=2, default=str)

    _atomic(path, ".tmp", write)


def _atomic_npz(path: str, arrays: dict) -> None:
    _atomic(path, ".tmp.npz", lambda tmp: np.savez(tmp, **{k: np.asarray(v) for k, v in arrays.items()}))


def _atomic(path: str, suffix: str, write) -> None:
    """Write through a temporary file and rename; a failed write leaves nothing behind."""
    tmp = path + suffix
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def rerun_command(model_path: str, target: str, options: RunOptions) -> str:
    parts = ["reprokit", "check", model_path, "--target", target]
    if options.reference != "ort":
        parts += ["--reference", options.reference]
    if options.inputs:
        parts += ["--inputs", options.inputs]
    else:
        parts += ["--seed", str(options.seed)]
    for name, dims in options.input_shapes.items():
        parts += ["--input-shapes", f"{name}:{'x'.join(map(str, dims))}"]
    if options.tolerance is not None:
        parts += ["--tol", str(options.tolerance)]
    if options.fail_regex:
        parts += ["--fail-regex", options.fail_regex]
    return " ".join(shlex.quote(p) for p in parts)


def shrink(model_path: str, target: str, out_dir: str, *, options: RunOptions | None = None,
           jobs: int = 1, replays: int | None = None, resume: bool = False, localize_first: bool = True,
           on_event=None, limits: Limits | None = None) -> ShrinkResult:
    """Reduce ``model_path`` to a minimal model that shows the same divergence under ``target``."""
    options = options or RunOptions()
    limits = limits or Limits()
    started = time.monotonic()
    event = on_event or (lambda text: None)
    state_dir = os.path.join(out_dir, STATE_DIR)
    if not resume and os.path.exists(os.path.join(state_dir, "journal.jsonl")):
        raise InputError(f"{out_dir} already holds a shrink run",
                         hint=f"continue it with --resume {out_dir}, or choose another -o directory")
    os.makedirs(state_dir, exist_ok=True)
    user_target = target
    target = _with_timing_cache(target, state_dir)
    oracle = make_oracle(target, options, os.path.join(state_dir, "calls"))
    backend_cls = backend_class(parse_target(target).engine)
    prepared = prepare(model_path, options, state_dir)
    _check_same_run(state_dir, model_path, user_target, options, prepared.feeds.arrays, oracle, resume)
    model = fold_constants(prepared.model)
    # Every model file of this run lives in models/; external weights stay where they are and
    # every engine call is told so (oracle.weights_dir): candidates never copy them.
    oracle.weights_dir = prepared.base_dir
    models_dir = os.path.join(state_dir, "models")
    os.makedirs(models_dir, exist_ok=True)
    original_nodes = len(model.graph.node)
    index = GraphIndex.build(model)
    journal = Journal(os.path.join(state_dir, "journal.jsonl"))

    # 1. Capture every node output of the reference once; its graph outputs serve the confirm.
    event("capturing reference activations")
    all_tensors = [t for outs in index.node_outputs for t in outs]
    store = _capture(oracle, model, index, prepared.feeds.arrays, all_tensors, state_dir, models_dir, resume,
                     limits, event)
    graph_outputs = {name: store.get(name) for name in index.graph_outputs if name in store}
    check_reference_finite(graph_outputs, oracle.reference)

    # 2. Confirm: the original must diverge, every replay with the same signature.
    model_file = save_model(model, os.path.join(models_dir, "original.onnx"), base_dir=prepared.base_dir)
    deterministic = backend_cls.deterministic
    replays = (0 if deterministic else 1) if replays is None else replays
    event(f"confirming the divergence ({1 + replays} target run{'s' if replays else ''})")
    verdict = oracle.judge(model_file, prepared.feeds.arrays, reference_outputs=graph_outputs)
    signature = verdict.signature
    rerun = rerun_command(model_path, target, options)
    if not verdict.diverges:
        worst = verdict.worst()
        numbers = f"worst {worst.name}: {verdict.criterion.metric.value} {worst.error:.3g}" if worst else ""
        raise NothingToReduce(
            f"the original model does not diverge under {target} ({verdict.criterion.describe()}; {numbers})",
            hint=f"nothing to reduce; rerun the check by hand: {rerun}")
    for replay in range(replays):
        replayed = oracle.run_target(model_file, prepared.feeds.arrays)
        again = oracle.verdict_from(replayed, graph_outputs)
        replayed.discard()
        if not signature.same_bug(again.signature):
            raise NothingToReduce(
                f"the divergence is flaky: run 1 gave {signature.describe()}, replay {replay + 1} gave "
                f"{again.signature.describe()}",
                hint=f"stabilize the target first (fixed tactics, timing cache); rerun: {rerun}")
    event(f"diverges: {signature.describe()}")
    # A build error needs no run: engines that can stop after building (TensorRT) do so.
    oracle.build_only = signature.kind is Kind.BUILD_ERROR

    reducer = Reducer(model, index, store, prepared.feeds.arrays, oracle, signature,
                      workdir=models_dir, journal=journal, jobs=jobs, on_event=event,
                      best=frozenset(range(original_nodes)))
    reducer.stats["confirm"] = _confirm_stats(oracle)
    writer = _BestWriter(out_dir, model_path, target, options, original_nodes, started)
    reducer.on_accept = lambda r, step: writer.write(r, "running")

    # 3. Localize from a layerwise run of the target (one call), then reduce.
    setup_calls = 1 + replays
    budget_note = ""
    try:
        localized = False
        if localize_first and signature.kind in (Kind.NONFINITE, Kind.MISMATCH):
            reducer.begin("layerwise")
            began = time.monotonic()
            reducer.anchors, reducer.origins = _anchors(
                oracle, model, store, prepared.feeds.arrays, models_dir, signature, journal, reducer)
            reducer.stats["layerwise"].seconds += time.monotonic() - began
            setup_calls += 1
            event(f"layerwise: anchors {[node_label(model, a) for a in reducer.anchors[:3]]}")
        max_calls = auto_call_budget(original_nodes) if limits.max_calls == -1 else limits.max_calls
        try:
            # localize and window are bounded by about log2 of the graph each and always finish,
            # so the result is never larger than a bisection's; the budget caps what follows.
            if reducer.anchors:
                reducer.begin("localize")
                localized = localize.run(reducer)
            if not localized:
                reducer.begin("window")
                window.run(reducer)
            reducer.budget = None if not max_calls else max(0, max_calls - setup_calls)
            reducer.begin("branches")
            branches.run(reducer)
            reducer.begin("ddmin")
            ddmin.run(reducer)
        except BudgetExhausted:
            budget_note = (f"stopped at the call budget ({max_calls} target calls, --max-calls); the model is the "
                           "smallest found so far. `--resume` with a larger --max-calls (0: no limit) continues")
            event(budget_note)
        reducer.close()
        reducer.begin("final")
        final = reducer.extraction(reducer.best)
        minimal_model = final.model
        judged = save_model(minimal_model, os.path.join(models_dir, "final.onnx"), base_dir=prepared.base_dir,
                            self_contained=True)
        reference = {n: store.get(n) for n in final.outputs if n in store}
        final_verdict = oracle.judge(judged, final.feeds, reference_outputs=reference)
        minimal_path = os.path.join(out_dir, "minimal.onnx")
        writer.write(reducer, "done", final_verdict=final_verdict, minimal_model=minimal_model,
                     feeds=final.feeds, reference=reference, note=budget_note)
    except BaseException as exc:
        reducer.close(interrupted=True)
        interrupted = isinstance(exc, KeyboardInterrupt)
        try:
            writer.write(reducer, "interrupted" if interrupted else "failed")
        except Exception:  # the disk may be what failed: keep the previous best-so-far as it is
            pass
        raise
    notes = prepared.notes + ([budget_note] if budget_note else [])
    return ShrinkResult(writer.summary, out_dir, minimal_path, final_verdict, notes)


def _resources(stats, wall: float) -> dict:
    """Where time and memory went: engine calls (in worker processes) versus reprokit's own
    bookkeeping (graph surgery, extraction, comparison), and each side's peak resident memory."""
    import resource

    engine = stats.target_seconds + stats.reference_seconds
    return {
        "reprokit_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "largest_engine_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "engine_seconds": round(engine, 3),
        "bookkeeping_seconds": round(max(0.0, wall - engine), 3),
        "bookkeeping_share": round(max(0.0, wall - engine) / wall, 3) if wall > 0 else 0.0,
    }


def node_label(model, index: int) -> str:
    """A node's name, or op_index for unnamed nodes (never an empty string)."""
    node = model.graph.node[index]
    return node.name or f"{node.op_type}_{index}"


def _check_same_run(state_dir, model_path, target, options, feeds, oracle, resume) -> None:
    """--resume continues only the run that was started: same model, feeds, target, criterion."""
    from reprokit.oracle import feeds_digest, file_digest

    fingerprint = {
        "model": file_digest(model_path), "feeds": feeds_digest(feeds), "target": str(parse_target(target)),
        "reference": oracle.reference, "criterion": oracle.criterion.describe(),
        "fail_regex": options.fail_regex,
        "input_shapes": {k: list(v) for k, v in sorted(options.input_shapes.items())},
    }
    path = os.path.join(state_dir, "run.json")
    if resume and os.path.exists(path):
        with open(path) as handle:
            before = json.load(handle)
        changed = [k for k in fingerprint if before.get(k) != fingerprint[k]]
        if changed:
            raise InputError(
                f"--resume: this run differs from the one in {os.path.dirname(state_dir)} in {', '.join(changed)}",
                hint="resume with the same model, inputs/seed, target and tolerances, or use a new -o directory")
    _atomic_json(path, fingerprint)


def _with_timing_cache(target: str, state_dir: str) -> str:
    """TensorRT targets share one timing cache across every build of a shrink run."""
    spec = parse_target(target)
    if spec.engine != "trt" or spec.has("timing-cache"):
        return target
    return str(spec.with_options(f"timing-cache={os.path.abspath(os.path.join(state_dir, 'timing.cache'))}"))


def _confirm_stats(oracle):
    from reprokit.reduce.reducer import PassStats

    return PassStats(calls=oracle.stats.target, seconds=oracle.stats.target_seconds)


def _capture(oracle, model, index, feeds, names, state_dir, models_dir, resume, limits, event) -> ActivationStore:
    """Every node output of the reference, on disk, in as many runs as the memory budget needs."""
    from reprokit.activations import tensor_bytes

    capture_dir = os.path.join(state_dir, "activations")
    if resume and os.path.exists(os.path.join(capture_dir, ActivationStore.INDEX)):
        return ActivationStore.open(capture_dir)
    sizes = {n: tensor_bytes(index.value_info[n]) for n in names if n in index.value_info}

    def run_chunk(chunk):
        path = save_model(mark_outputs(model, chunk), os.path.join(models_dir, "capture.onnx"))
        return oracle.run_reference(path, feeds, chunk)

    return ActivationStore.capture(run_chunk, names, sizes, capture_dir, chunk_bytes=limits.capture_chunk_bytes,
                                   max_disk_bytes=limits.max_activation_disk_bytes, on_event=event)


def _anchors(oracle, model, store, feeds, models_dir, signature, journal, reducer):
    """From one layerwise target run (journaled): the anchors, nodes where the signature's kind
    first shows while their inputs do not, and the origins, the first diverging tensors of any
    kind whose inputs still agree (where the trouble starts before it takes the signature's
    form, e.g. a variance that overflows to inf upstream of the mismatch it causes)."""
    saved = journal.get("layerwise")
    if saved is not None:
        return saved["anchors"], saved.get("origins", [])
    names = [t for t, *_ in float_node_outputs(model)]
    marked = save_model(mark_outputs(model, names), os.path.join(models_dir, "layerwise.onnx"), base_dir=models_dir)
    result = oracle.run_target(marked, feeds, names)
    reducer.stats["layerwise"].calls += 1
    anchors: list[int] = []
    origins: list[int] = []
    if result.status == "ok":
        report = compare_marked_run(model, store, result, oracle)
        result.discard()
        producer = reducer.index.producer
        status = {r.tensor: _row_kind(r) for r in report.rows}
        wanted = signature.kind.value
        for row in report.rows:
            node = producer[row.tensor]
            if status[row.tensor] == wanted and not any(
                status.get(i) == wanted for i in reducer.index.node_inputs[node]
            ):
                anchors.append(node)
        origins = sorted(dict.fromkeys(producer[r.tensor] for r in report.first))
        if not anchors:
            anchors = list(origins)
        anchors = sorted(dict.fromkeys(anchors))
    journal.put("layerwise", {"anchors": anchors, "origins": origins, "status": result.status})
    return anchors, origins


def _row_kind(row) -> str:
    """The verdict kind one tensor shows on its own: nonfinite, mismatch or agree."""
    if row.error.nonfinite_in_target_only:
        return Kind.NONFINITE.value
    return Kind.MISMATCH.value if row.error.exceeds else Kind.AGREE.value


class _BestWriter:
    """Rewrites minimal.onnx, inputs.npz and summary.json after every accepted step."""

    def __init__(self, out_dir, model_path, target, options, original_nodes, started):
        self.out_dir = out_dir
        self.model_path = model_path
        self.target = target
        self.options = options
        self.original_nodes = original_nodes
        self.started = started
        self.summary: dict = {}

    def write(self, reducer, status, *, final_verdict=None, minimal_model=None, feeds=None, reference=None,
              note: str = ""):
        """Write the best so far as ONE step: every file goes to a temporary name first and
        the renames follow only when all were written, so a full disk or an interrupt never
        leaves a minimal.onnx beside the inputs.npz of another model."""
        if minimal_model is None:
            extraction = reducer.extraction(reducer.best)
            minimal_model, feeds = extraction.model, extraction.feeds
        staged: list[tuple[str, str]] = []
        try:
            def stage(name: str, write) -> None:
                final = os.path.join(self.out_dir, name)
                tmp = os.path.join(self.out_dir, f".{name}.writing")
                write(tmp)
                staged.append((tmp, final))

            stage("minimal.onnx", lambda tmp: save_model(minimal_model, tmp, base_dir=reducer.oracle.weights_dir,
                                                         self_contained=True))
            stage("inputs.npz", lambda tmp: _atomic_npz(tmp, feeds))
            if reference is not None:
                stage("reference_outputs.npz", lambda tmp: _atomic_npz(tmp, reference))
            self.summary = self._summary(reducer, status, minimal_model, feeds, final_verdict, note)
            stage("summary.json", lambda tmp: _atomic_json(tmp, self.summary))
        except BaseException:
            for tmp, _ in staged:
                if os.path.exists(tmp):
                    os.remove(tmp)
            raise
        for tmp, final in staged:  # summary.json last: it vouches for the files before it
            os.replace(tmp, final)

    def _summary(self, reducer, status, minimal_model, feeds, final_verdict, note) -> dict:
        stats = reducer.oracle.stats
        nodes = [minimal_model.graph.node[i] for i in range(len(minimal_model.graph.node))]
        summary = {
            "schema": "reprokit.shrink/1",
            "status": status,
            "model": self.model_path,
            "target": reducer.oracle.target,
            "reference": reducer.oracle.reference,
            "criterion": reducer.oracle.criterion.describe(),
            "signature": reducer.signature.to_json(),
            "original": {"nodes": self.original_nodes},
            "minimal": {
                "nodes": len(nodes),
                "ops": sorted(n.op_type for n in nodes),
                "node_names": [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)],
                "inputs": [{"name": i.name, "shape": list(np.asarray(feeds[i.name]).shape)} for i in minimal_model.graph.input if i.name in feeds],
                "outputs": [{"name": o.name, "shape": [d.dim_value for d in o.type.tensor_type.shape.dim]} for o in minimal_model.graph.output],
            },
            "calls": {"target": stats.target, "reference": stats.reference,
                      "cached": stats.cached + sum(s.cached for s in reducer.stats.values()),
                      "target_seconds": round(stats.target_seconds, 3),
                      "seconds_per_target_call": round(stats.target_seconds / max(1, stats.target), 3),
                      "build_seconds": [round(b, 3) for b in stats.build_seconds]},
            "one_minimal": reducer.one_minimal,
            "resources": _resources(stats, time.monotonic() - self.started),
            "budget": {"target_calls_for_passes": reducer.budget, "spent": reducer.spent,
                       "stopped": bool(note)},
            "wall_s": round(time.monotonic() - self.started, 3),
            "steps": [s.to_json(name) for name, s in reducer.stats.items()],
            "other_findings": reducer.findings,
            "rerun": rerun_command(self.model_path, self.target, self.options),
        }
        if note:
            summary["note"] = note
        if final_verdict is not None:
            summary["verdict"] = final_verdict.to_json()
        return summary


def pack_result(result: ShrinkResult, target: str, options: RunOptions, *, fmt: str = "tar.gz",
                redact: bool = False, on_event=None, audit=None):
    """Pack the minimal model of a finished shrink into OUT/report.<fmt>, with shrink's context.
    ``audit`` (a reprokit.audit.AuditResult of the original model) adds audit/ and the sweep."""
    from dataclasses import replace

    from reprokit.report import pack

    summary = result.summary
    context = {"original_nodes": summary["original"]["nodes"], "minimal_nodes": summary["minimal"]["nodes"],
               "calls": summary["calls"]["target"], "one_minimal": summary["one_minimal"],
               "original_model": summary["model"], "original_signature": summary["signature"]}
    if audit is not None:  # ISSUE.md's "what we tried" (sweep rows) and the smallest workaround
        context.update(audit.issue_context())
    packed = pack(result.minimal_path, target, os.path.join(result.out_dir, f"report.{fmt}"),
                  options=replace(options, inputs=os.path.join(result.out_dir, "inputs.npz"),
                                  input_shapes={}, val_ranges={}),
                  fmt=fmt, redact=redact, context=context, on_event=on_event,
                  audit_dir=audit.out_dir if audit is not None else None)
    summary["report"] = packed.archive
    _atomic_json(os.path.join(result.out_dir, "summary.json"), summary)
    return packed
