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
from reprokit.arrays import save_npz
from reprokit.backends import backend_class
from reprokit.errors import InputError, NothingToReduce, NotReproduced
from reprokit.model import mark_outputs, save_model, staged_data
from reprokit.oracle import Kind, check_reference_finite
from reprokit.reduce import pipeline
from reprokit.reduce.reducer import Journal, Reducer
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
    """About what polygraphy's bisect spends on a graph of ``nodes`` (log2 of the nodes for each
    end), plus what reprokit spends on its promises: the confirming call, the final judgement of
    the result alone and one replay of it. Every target call counts against it."""
    return 2 * math.ceil(math.log2(nodes + 1)) + 3


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
    _atomic(path, ".tmp.npz", lambda tmp: save_npz(tmp, arrays))


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


def option_args(options: RunOptions) -> list[str]:
    """The command-line options that give ``options`` back: every one that shapes the feeds or
    the criterion, so a printed command judges exactly what this run judged."""
    defaults = RunOptions()
    parts: list[str] = []
    if options.reference != defaults.reference:
        parts += ["--reference", options.reference]
    if options.inputs:
        parts += ["--inputs", options.inputs]
        if options.sample != defaults.sample:
            parts += ["--sample", str(options.sample)]
    else:
        parts += ["--seed", str(options.seed)]
        for name, (lo, hi) in options.val_ranges.items():
            parts += ["--val-range", f"{name + ':' if name is not None else ''}[{lo!r},{hi!r}]"]
    for name, dims in options.input_shapes.items():
        parts += ["--input-shapes", f"{name}:{'x'.join(map(str, dims))}"]
    if options.metric != defaults.metric:
        parts += ["--metric", options.metric]
    for flag, value in (("--tol", options.tolerance), ("--atol", options.atol), ("--rtol", options.rtol)):
        if value is not None:
            parts += [flag, repr(float(value))]
    if options.timeout != defaults.timeout:
        parts += ["--timeout", repr(float(options.timeout))]
    if options.fail_regex:
        parts += ["--fail-regex", options.fail_regex]
    return parts


def rerun_command(model_path: str, target: str, options: RunOptions) -> str:
    """The check to rerun by hand, under the user's own target: the timing cache a shrink run
    adds for itself (:func:`_with_timing_cache`) is private to the run and left out."""
    parts = ["reprokit", "check", model_path, "--target", _without_private_timing_cache(target),
             *option_args(options)]
    return " ".join(shlex.quote(p) for p in parts)


def saved_run(out_dir: str) -> dict:
    """What ``--resume OUT`` needs to continue a run with no other argument: the model, the
    target and the run options (as command-line options), from OUT/.reprokit/run.json."""
    path = os.path.join(out_dir, STATE_DIR, "run.json")
    try:
        with open(path) as handle:
            saved = json.load(handle)["resume"]
        return {"model": saved["model"], "target": saved["target"], "args": list(saved["args"])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--resume {out_dir}: no shrink run to continue there ({path} is missing or unreadable)",
                         hint="give the directory a shrink wrote with -o, or start over: "
                              "reprokit shrink MODEL --target SPEC -o DIR") from exc


def resume_hint(out_dir: str, extra: list[str] | tuple = ()) -> str:
    """The command that continues an interrupted run in ``out_dir``, or why there is none."""
    if not os.path.exists(os.path.join(out_dir, STATE_DIR, "run.json")):
        return "nothing was saved yet; run the same command again"
    command = " ".join(shlex.quote(p) for p in ["reprokit", "shrink", "--resume", out_dir, *extra])
    return f"the best so far is kept in {out_dir}; continue with: {command}"


def shrink(model_path: str, target: str, out_dir: str, *, options: RunOptions | None = None,
           jobs: int = 1, replays: int | None = None, resume: bool = False, localize_first: bool = True,
           on_event=None, limits: Limits | None = None, pack_candidates: bool = True,
           search_accumulated: bool = False) -> ShrinkResult:
    """Reduce ``model_path`` to a minimal model that shows the same divergence under ``target``.
    The steps: open the run, capture, confirm, reduce (reduce/pipeline.py), finish."""
    options = options or RunOptions()
    limits = limits or Limits()
    run = _open_run(model_path, target, out_dir, options, resume, on_event or (lambda text: None))
    store = _capture(run.oracle, run.model, run.index, run.feeds,
                     [t for outs in run.index.node_outputs for t in outs], run.state_dir, run.models_dir,
                     resume, limits, run.event)
    run.event("capturing reference activations: done")
    graph_outputs = {name: store.get(name) for name in run.index.graph_outputs if name in store}
    check_reference_finite(graph_outputs, run.oracle.reference)
    deterministic = backend_class(parse_target(run.target).engine).deterministic
    original_replays = replays or 0
    minimal_replays = (0 if deterministic else 1) if replays is None else replays
    verdict = _confirm(run, graph_outputs, original_replays)
    signature = verdict.signature
    # A build error needs no run: engines that can stop after building (TensorRT) do so.
    run.oracle.build_only = signature.kind is Kind.BUILD_ERROR

    original_nodes = len(run.model.graph.node)
    reducer = Reducer(run.model, run.index, store, run.feeds, run.oracle, signature,
                      workdir=run.models_dir, journal=run.journal, jobs=jobs, on_event=run.event,
                      best=frozenset(range(original_nodes)))
    reducer.packing = pipeline.packing_for(signature.kind, pack_candidates)
    if signature.kind in (Kind.BUILD_ERROR, Kind.CRASH):
        from reprokit.oracle import normalize_message

        reducer.message_key = normalize_message(verdict.message)
    reducer.pack_bytes = limits.capture_chunk_bytes
    reducer.pack_nodes = max(512, 6 * original_nodes)
    reducer.stats["confirm"] = _confirm_stats(run.oracle, original_nodes)
    max_calls = auto_call_budget(original_nodes) if limits.max_calls == -1 else limits.max_calls
    writer = _BestWriter(out_dir, model_path, run.target, options, original_nodes, run.started, max_calls)
    reducer.on_accept = lambda r, step: writer.write(r, "running")
    if max_calls:  # a promise: every target call counts, the final judgement is reserved
        reducer.budget = max(0, max_calls - run.oracle.stats.target - 1 - minimal_replays)
    try:
        outcome = pipeline.reduce(reducer, pipeline.Plan(localize=localize_first, pack=pack_candidates,
                                                         search_accumulated=search_accumulated),
                                  message=verdict.message)
        reducer.close()
        if outcome == "accumulated":
            return _accumulated(run, reducer, writer, verdict)
        note = ""
        if outcome == "budget":
            reducer.stopped = True
            note = (f"stopped at the call budget ({max_calls} target calls, --max-calls); the model is the "
                    "smallest found so far. `--resume` with a larger --max-calls (0: no limit) continues")
            run.event(note)
        return _finish(run, reducer, writer, store, minimal_replays, note)
    except BaseException as exc:
        reducer.close(interrupted=True)
        if isinstance(exc, NotReproduced):
            raise
        interrupted = isinstance(exc, KeyboardInterrupt)
        try:
            writer.write(reducer, "interrupted" if interrupted else "failed")
        except Exception:  # the disk may be what failed: keep the previous best-so-far as it is
            pass
        raise


@dataclass
class _Run:
    """What every step of one shrink run shares."""

    model_path: str
    target: str  # the user's target, plus the run's private timing cache for TensorRT
    options: RunOptions
    out_dir: str
    state_dir: str
    models_dir: str
    oracle: object
    prepared: object
    model: object
    index: GraphIndex
    journal: Journal
    event: object
    started: float

    @property
    def feeds(self) -> dict:
        return self.prepared.feeds.arrays


def _open_run(model_path, target, out_dir, options, resume, event) -> _Run:
    """State folder, oracle, model and feeds. The model is reduced exactly as given (constants
    are folded per candidate, never before the confirming call)."""
    started = time.monotonic()
    state_dir = os.path.join(out_dir, STATE_DIR)
    if not resume and os.path.exists(os.path.join(state_dir, "journal.jsonl")):
        raise InputError(f"{out_dir} already holds a shrink run",
                         hint=f"continue it with --resume {out_dir}, or choose another -o directory")
    os.makedirs(state_dir, exist_ok=True)
    user_target = target
    target = _with_timing_cache(target, state_dir)
    oracle = make_oracle(target, options, os.path.join(state_dir, "calls"))
    prepared = prepare(model_path, options, state_dir)
    _check_same_run(state_dir, model_path, user_target, options, prepared.feeds.arrays, oracle, resume)
    # Every model file of this run lives in models/; external weights stay where they are and
    # every engine call is told so (oracle.weights_dir): candidates never copy them.
    oracle.weights_dir = prepared.base_dir
    models_dir = os.path.join(state_dir, "models")
    os.makedirs(models_dir, exist_ok=True)
    model = prepared.model
    event("capturing reference activations")
    return _Run(model_path, target, options, out_dir, state_dir, models_dir, oracle, prepared, model,
                GraphIndex.build(model), Journal(os.path.join(state_dir, "journal.jsonl")), event, started)


def _confirm(run: _Run, graph_outputs: dict, replays: int):
    """The original must diverge (and every replay the user asked for, with the same signature)."""
    oracle = run.oracle
    model_file = save_model(run.model, os.path.join(run.models_dir, "original.onnx"),
                            base_dir=run.prepared.base_dir)
    run.event(f"confirming the divergence ({1 + replays} target run{'s' if replays else ''})")
    verdict = oracle.judge(model_file, run.feeds, reference_outputs=graph_outputs)
    signature = verdict.signature
    rerun = rerun_command(run.model_path, run.target, run.options)
    if not verdict.diverges:
        worst = verdict.worst()
        numbers = f"worst {worst.name}: {verdict.criterion.metric.value} {worst.error:.3g}" if worst else ""
        raise NothingToReduce(
            f"the original model does not diverge under {run.target} ({verdict.criterion.describe()}; {numbers})",
            hint=f"nothing to reduce; rerun the check by hand: {rerun}")
    for replay in range(replays):
        replayed = oracle.run_target(model_file, run.feeds)
        again = oracle.verdict_from(replayed, graph_outputs)
        replayed.discard()
        if not signature.same_bug(again.signature):
            raise NothingToReduce(
                f"the divergence is flaky: run 1 gave {signature.describe()}, replay {replay + 1} gave "
                f"{again.signature.describe()}",
                hint=f"stabilize the target first (fixed tactics, timing cache); rerun: {rerun}")
    run.event(f"diverges: {signature.describe()}")
    return verdict


def _finish(run: _Run, reducer, writer, store, replays: int, note: str) -> ShrinkResult:
    """The last word is a single model: the best is judged alone (and replayed where the engine
    is not deterministic) before it is written as done. A best that does not reproduce alone
    falls back to the previous accepted best (twice at most), then stops with its own outcome."""
    reducer.begin("final")
    tried = []
    for nodes in list(dict.fromkeys(reversed(reducer.history)))[:3] or [reducer.best]:
        calls_before = run.oracle.stats.target
        final = reducer.extraction(nodes)
        judged = save_model(final.model, os.path.join(run.models_dir, "final.onnx"),
                            base_dir=run.prepared.base_dir, self_contained=True)
        reference = {n: store.get(n) for n in final.outputs if n in store}
        verdicts = [run.oracle.judge(judged, final.feeds, reference_outputs=reference)]
        for _ in range(_replays_for(reducer, nodes, replays) if verdicts[0].diverges else 0):
            replayed = run.oracle.run_target(judged, final.feeds)
            verdicts.append(run.oracle.verdict_from(replayed, reference))
            replayed.discard()
        made = run.oracle.stats.target - calls_before
        reducer.stats["final"].calls += made
        reducer.stats["final"].nodes_built += made * len(nodes)
        tried.append(f"{len(nodes)} nodes: " + ", ".join(v.signature.describe() for v in verdicts))
        if all(v.diverges and reducer.signature.same_bug(v.signature) for v in verdicts):
            reducer.best = frozenset(nodes)
            if len(tried) > 1:
                note = (note + "; " if note else "") + ("smaller results did not reproduce alone: "
                                                          + " | ".join(tried[:-1]))
            writer.write(reducer, "done", final_verdict=verdicts[0], minimal_model=final.model,
                         feeds=final.feeds, reference=reference, note=note)
            notes = run.prepared.notes + ([note] if note else [])
            return ShrinkResult(writer.summary, run.out_dir, os.path.join(run.out_dir, "minimal.onnx"),
                                verdicts[0], notes)
    writer.write(reducer, "not-reproduced", final_verdict=verdicts[0],
                 note="the minimal model does not reproduce alone: " + " | ".join(tried))
    raise NotReproduced(
        f"the reduced model does not show {reducer.signature.describe()} when judged alone ({tried[0]})",
        hint="the target is flaky or the divergence needs more context; rerun with --replays 2, or "
             f"look at {run.out_dir}/summary.json (steps, other_findings)")


def _replays_for(reducer, nodes, replays: int) -> int:
    """Replays of the result alone. A pass/fail search that judged the result alone and saw no
    contradiction (a group failing with no member that fails alone) has already run it twice
    in effect (the confirming call and its own); one that saw contradictions replays it twice."""
    if reducer.packing != "group" or not replays:
        return replays
    if reducer.contradictions:
        return max(replays, 2)
    known = reducer.cached(nodes)
    return 0 if known is not None and not known.packed else replays


def _accumulated(run: _Run, reducer, writer, verdict) -> ShrinkResult:
    """No small region shows the mismatch on its own: say so, with the attribution, and write no
    model called minimal."""
    reducer.begin("attribution")
    found = pipeline.attribution(reducer, lambda i: node_label(run.model, i))
    note = ("accumulated error: no single node, pair or region around the first divergence shows the "
            f"mismatch on its own ({found['diverging_alone']} of {found['nodes_judged_alone']} nodes exceed the "
            "tolerance alone); see `attribution` for the layers that contribute most"
            + (f"; try keeping them in fp32: fp32-nodes={found['fp32_nodes']}" if found["fp32_nodes"] else ""))
    run.event(note)
    writer.write_summary(reducer, "accumulated", final_verdict=verdict, note=note, attribution=found)
    return ShrinkResult(writer.summary, run.out_dir, "", verdict, run.prepared.notes + [note])


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
    # Absolute paths: `reprokit shrink --resume OUT` works from any directory (saved_run).
    absolute = options.inputs and os.path.abspath(options.inputs)
    from dataclasses import replace

    resume_with = {"model": os.path.abspath(model_path), "target": target,
                   "args": option_args(replace(options, inputs=absolute or None))}
    _atomic_json(path, {**fingerprint, "resume": resume_with})


def _with_timing_cache(target: str, state_dir: str) -> str:
    """TensorRT targets share one timing cache across every build of a shrink run."""
    spec = parse_target(target)
    if spec.engine != "trt" or spec.has("timing-cache"):
        return target
    return str(spec.with_options(f"timing-cache={os.path.abspath(os.path.join(state_dir, 'timing.cache'))}"))


def _without_private_timing_cache(target: str) -> str:
    """``target`` less the timing cache :func:`_with_timing_cache` put in a run's state folder."""
    from reprokit.spec import TargetSpec

    spec = parse_target(target)
    private = os.path.join(STATE_DIR, "timing.cache")
    options = tuple((k, v) for k, v in spec.options
                    if not (k == "timing-cache" and str(v).endswith(os.sep + private)))
    return target if options == spec.options else str(TargetSpec(spec.engine, options, spec.command))


def _confirm_stats(oracle, nodes: int):
    from reprokit.reduce.reducer import PassStats

    return PassStats(calls=oracle.stats.target, seconds=oracle.stats.target_seconds,
                     nodes_built=oracle.stats.target * nodes)


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


class _BestWriter:
    """Rewrites minimal.onnx, inputs.npz and summary.json after every accepted step."""

    def __init__(self, out_dir, model_path, target, options, original_nodes, started, max_calls=None):
        self.max_calls = max_calls
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
                staged.extend(staged_data(tmp, final))  # a model's external data file moves with it

            minimal_path = os.path.join(self.out_dir, "minimal.onnx")
            stage("minimal.onnx", lambda tmp: save_model(minimal_model, tmp, base_dir=reducer.oracle.weights_dir,
                                                         self_contained=True, final_path=minimal_path))
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
        stale = minimal_path + ".data"
        if os.path.exists(stale) and stale not in {final for _, final in staged}:
            os.remove(stale)  # the previous best needed external weights; this one holds its own

    def write_summary(self, reducer, status, *, final_verdict=None, note: str = "", attribution=None):
        """summary.json alone: an outcome with no model to call minimal (accumulated error)."""
        self.summary = self._summary(reducer, status, None, {}, final_verdict, note)
        self.summary["attribution"] = attribution
        _atomic_json(os.path.join(self.out_dir, "summary.json"), self.summary)

    def _summary(self, reducer, status, minimal_model, feeds, final_verdict, note) -> dict:
        stats = reducer.oracle.stats
        nodes = list(minimal_model.graph.node) if minimal_model is not None else []
        built = sum(s.nodes_built for s in reducer.stats.values())
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
                "inputs": [{"name": i.name, "shape": list(np.asarray(feeds[i.name]).shape)}
                           for i in (minimal_model.graph.input if nodes else []) if i.name in feeds],
                "outputs": [{"name": o.name, "shape": [d.dim_value for d in o.type.tensor_type.shape.dim]}
                            for o in (minimal_model.graph.output if nodes else [])],
            },
            "calls": {"target": stats.target, "reference": stats.reference,
                      "cached": stats.cached + sum(s.cached for s in reducer.stats.values()),
                      "target_seconds": round(stats.target_seconds, 3),
                      "seconds_per_target_call": round(stats.target_seconds / max(1, stats.target), 3),
                      "build_seconds": [round(b, 3) for b in stats.build_seconds]},
            # Build work: nodes in the models the target built, over every call (packs count
            # all their members), the number to set beside polygraphy's.
            "build_work": {"nodes_built": built, "per_call": round(built / max(1, stats.target), 1),
                           "candidates_judged": sum(s.candidates for s in reducer.stats.values())},
            "one_minimal": reducer.one_minimal,
            "resources": _resources(stats, time.monotonic() - self.started),
            "budget": {"max_calls": self.max_calls, "target_calls_for_passes": reducer.budget,
                       "spent": reducer.spent, "stopped": reducer.stopped},
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
