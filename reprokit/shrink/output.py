"""What a shrink run writes: minimal.onnx, inputs.npz and summary.json after every accepted step
(as one all-or-nothing step), summary.json alone for an accumulated error, and the report archive
of a finished run. No engine runs here, except the archive's own checks (report.pack).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from reprokit.engine import twinrun
from reprokit.engine.backends.trt_setup import rtx_requested
from reprokit.engine.bug import tested_by
from reprokit.engine.session import RunOptions
from reprokit.errors import NothingToReduce
from reprokit.graph.index import count_nodes
from reprokit.graph.io import external_locations, load_model, save_model, staged_data
from reprokit.report.bundle import pack
from reprokit.shrink.clock import StepClock, retime, timed_steps
from reprokit.shrink.runstate import _atomic_json, _atomic_npz, rerun_command
from reprokit.spec import parse_target


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


@dataclass
class _BestWriter:
    """Rewrites minimal.onnx, inputs.npz and summary.json after every accepted step."""

    out_dir: str
    model_path: str
    target: str  # the user's target (a TensorRT run's private timing cache left out)
    options: RunOptions
    original_nodes: int
    started: float
    max_calls: int | None = None
    earlier_calls: int = 0  # a resumed run's calls before this process
    file_nodes: int | None = None
    warnings: list = field(default_factory=list)  # the original's degenerate reference outputs
    given_nodes: int | None = None  # the model as given, nodes inside If/Loop bodies counted
    shapes: dict | None = None  # what shape shrinking did (input elements before/after, steps)
    samples: list | None = None  # per input sample: diverged originally, reproduces on the minimal
    summary: dict = field(default_factory=dict)
    clock: StepClock | None = None  # wall seconds per step; its start is the run's (self.started)
    emulation_choice: str = ""  # a finding that depends on how the emulator stores constants (final.py)
    fixes_alone: dict | None = None  # does fixing the minimal alone fix the original (final.fixes_alone)

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

    def _original(self) -> dict:
        found = {"nodes": self.original_nodes}
        if self.given_nodes is not None:
            found["nodes_with_subgraphs"] = self.given_nodes
        if self.file_nodes is not None and self.file_nodes != self.original_nodes:
            found["file_nodes"] = self.file_nodes
            found["why"] = ("control flow opened (If nodes inlined, Loops unrolled, as the feeds run them): "
                            "shrink counts the nodes that were inside" if self.given_nodes is not None else
                            "--input-shapes froze the dynamic dims and folded the constants that depended on "
                            "them: shrink starts from the folded model" if self.options.input_shapes else
                            "constants folded before the survey (polygraphy's surgeon sanitize --fold-constants): "
                            "shrink starts from the folded model, node names the model's own; "
                            "--no-fold-constants reduces the model as given")
        return found

    def write_summary(self, reducer, status, *, final_verdict=None, note: str = "", attribution=None):
        """summary.json alone: an outcome with no model to call minimal (accumulated error)."""
        self.summary = self._summary(reducer, status, None, {}, final_verdict, note)
        self.summary["attribution"] = attribution
        _atomic_json(os.path.join(self.out_dir, "summary.json"), self.summary)

    def _summary(self, reducer, status, minimal_model, feeds, final_verdict, note) -> dict:
        now = time.monotonic()  # one instant: the steps' seconds add up to wall_s
        stats = reducer.oracle.stats
        nodes = list(minimal_model.graph.node) if minimal_model is not None else []
        built = sum(s.nodes_built for s in reducer.stats.values())
        summary = {
            "schema": "reprokit.shrink/1",
            "status": status,
            "model": self.model_path,
            "target": self.target,
            "reference": reducer.oracle.reference,
            "criterion": reducer.oracle.criterion.describe(),
            "check_policy": self.options.policy().to_json(),
            "signature": reducer.signature.to_json(),
            "original": self._original(),
            "minimal": {
                "nodes": len(nodes),
                "nodes_with_subgraphs": count_nodes(minimal_model.graph) if nodes else 0,
                "ops": sorted(n.op_type for n in nodes),
                "node_names": [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)],
                "inputs": [{"name": i.name, "shape": list(np.asarray(feeds[i.name]).shape)}
                           for i in (minimal_model.graph.input if nodes else []) if i.name in feeds],
                "outputs": [{"name": o.name, "shape": [d.dim_value for d in o.type.tensor_type.shape.dim]}
                            for o in (minimal_model.graph.output if nodes else [])],
            },
            # One source of truth: every target call of the run, a resumed run's earlier ones too.
            "calls": {"target": self.earlier_calls + stats.target, "this_process": stats.target,
                      "reference": stats.reference,
                      "cached": stats.cached + sum(s.cached for s in reducer.stats.values()),
                      "target_seconds": round(stats.target_seconds, 3),
                      "seconds_per_target_call": round(stats.target_seconds / max(1, stats.target), 3),
                      "build_seconds": [round(b, 3) for b in stats.build_seconds],
                      "timing_cache": timing_cache_note(reducer.oracle.target)},
            # Build work: nodes in the models the target built, over every call (packs count
            # all their members), the number to set beside polygraphy's.
            "build_work": {"nodes_built": built,
                           "heavy_built": sum(s.heavy_built for s in reducer.stats.values()),
                           # calls of light layers only (no heavy one) and their nodes: priced apart
                           # by buildcost.ESTIMATE, as bench/count_check.py's log prices a check's
                           "light_calls": sum(s.light_calls for s in reducer.stats.values()),
                           "light_nodes": sum(s.light_nodes for s in reducer.stats.values()),
                           "per_call": round(built / max(1, stats.target), 1),
                           "candidates_judged": sum(s.candidates for s in reducer.stats.values()),
                           "by_kind": built_by_kind(reducer.stats)},
            "one_minimal": reducer.one_minimal,
            "resources": _resources(stats, now - self.started),
            # issue 25: reprokit's own extraction, packing, writing and comparing (shrink/tally.py)
            "bookkeeping": reducer.tally.to_json(stats.feeds_seconds),
            "original_replays": reducer.original_replay,  # issue 25: did the replay ride with the survey?
            # issue 25: where the original's first judgement ran ("" : a call of its own at confirm)
            "original_confirmed": reducer.confirmed or "a call of its own (confirm step)",
            "budget": {"max_calls": self.max_calls, "target_calls_for_passes": reducer.budget,
                       "spent": reducer.spent, "stopped": reducer.stopped},
            "wall_s": round(now - self.started, 3),
            "steps": timed_steps({name: s.to_json(name) for name, s in reducer.stats.items()}, self.clock, now),
            "other_findings": reducer.findings,
            "rerun": rerun_command(self.model_path, self.target, self.options),
            "warnings": self.warnings,
            **({"emulation_choice": self.emulation_choice} if self.emulation_choice else {}),
            **({"fixes_alone": self.fixes_alone} if self.fixes_alone is not None else {}),
            "shapes": self.shapes,
            # which test decided "shows the original bug" (engine/bug.py), and what it cost
            # counted from the outcomes: how many accepted candidates each test judged
            "no_slippage": {"test": tested_by(reducer.judged_by, reducer.no_slippage.get("final", "")),
                            "accepted": dict(reducer.judged_by),
                            **(reducer.causal.report() if reducer.causal is not None else {}),
                            **{k: v for k, v in reducer.no_slippage.items() if k != "test"}},
        }
        if self.samples is not None:
            summary["samples"] = self.samples
        if note:
            summary["note"] = note
        if final_verdict is not None:
            summary["verdict"] = final_verdict.to_json()
        return summary


def timing_cache_note(target: str) -> dict | None:
    """What summary.json says of a TensorRT run's timing cache (None for other engines): every
    build of the run, in every worker, loads and saves the one file (``runstate._with_timing_cache``
    adds the run's own where the user named none), so a layer configuration is timed once per run."""
    spec = parse_target(target)
    if spec.engine != "trt":
        return None
    note = {"path": spec.get("timing-cache"),
            "shared": "every TensorRT build of this run loaded and saved this one timing cache: "
                      "a layer configuration timed in one call is not timed again in a later one"}
    if rtx_requested():  # measured in docs/benchmark.md: TensorRT-RTX builds the same with or without it
        note["shared"] += ("; TensorRT-RTX ignores timing caches (no-ops since 1.2: its kernels are "
                           "chosen when the engine runs), so there it saves nothing")
    return note


def pack_result(result, target: str, options: RunOptions, *, fmt: str = "tar.gz",
                redact: bool = False, on_event=None, audit=None):
    """Pack the minimal model of a finished shrink into OUT/report.<fmt>, with shrink's context.
    ``audit`` (a reprokit.audit.AuditResult of the original model) adds audit/ and the sweep."""

    summary = result.summary
    context = {"original_nodes": summary["original"]["nodes"], "minimal_nodes": summary["minimal"]["nodes"],
               "calls": summary["calls"]["target"], "one_minimal": summary["one_minimal"],
               "original_model": summary["model"], "original_signature": summary["signature"],
               "reference_warnings": summary.get("warnings", []), "samples": summary.get("samples")}
    if audit is not None:  # ISSUE.md's "what we tried" (sweep rows) and the smallest workaround
        context.update(audit.issue_context())
    if summary.get("exclusion"):  # --reference-model: ISSUE.md names both models and the tested exclusion
        context["exclusion"] = summary["exclusion"]
    if summary.get("torch"):  # --torch: the archive records the export settings
        context["torch"] = summary["torch"]
    # a quantized model: the minimal's outputs judged in the steps the shrink judged them in (its
    # own graph may have lost the Q nodes that made them quantized tensors)
    model, options = result.minimal_path, replace(options, inputs=os.path.join(result.out_dir, "inputs.npz"),
                                                  sample=None, input_shapes={}, val_ranges={},
                                                  quant_steps=summary.get("quant_steps"))
    if options.reference_model:  # the converted cut is the target's model; minimal.onnx its reference
        model = twinrun.write_target_cut(options.reference_model, summary["model"], result.minimal_path,
                                         os.path.join(result.out_dir, "minimal.target.onnx"))
        options = replace(options, reference_model=result.minimal_path)
    packed = pack(model, target, os.path.join(result.out_dir, f"report.{fmt}"), options=options,
                  fmt=fmt, redact=redact, context=context, on_event=on_event,
                  audit_dir=audit.out_dir if audit is not None else None)
    return _record_report(result.out_dir, summary, packed, result.clock)


# An accumulated error has no small repro: the archive carries the whole model, up to this size.
ACCUMULATED_PACK_LIMIT = 512 << 20


def pack_accumulated(result, model_path: str, target: str, options: RunOptions, *, fmt: str = "tar.gz",
                     redact: bool = False, on_event=None):
    """Pack an accumulated-error run: its drift window when one was found (the smallest stretch
    that drifts on its own, fed with the captured activations), else the ORIGINAL model; ISSUE.md
    carries the attribution. None (with a note) when the whole model is too big to travel."""
    window = result.summary.get("window")
    if window and os.path.exists(window["path"]):
        # the smallest window that drifts on its own travels instead of the whole model
        context = {"attribution": result.summary["attribution"], "window": window}
        try:
            packed = pack(window["path"], target, os.path.join(result.out_dir, f"report.{fmt}"),
                          options=replace(options, inputs=window["inputs"], sample=None, input_shapes={},
                                          val_ranges={}, quant_steps=window.get("quant_steps")),
                          fmt=fmt, redact=redact, context=context, on_event=on_event)
            result.summary["report_holds"] = "the drift window"
            return _record_report(result.out_dir, result.summary, packed)
        except NothingToReduce as exc:
            # judged alone, the window can fall within the tolerance (a run before the window
            # recorded its steps judged a quantized window's outputs at rel-l2; a target that
            # drifts less on the window's own feeds): the whole model, which diverges, travels
            # instead; said, never dropped
            note = (f"the drift window does not diverge when packed alone ({exc.message}); the archive holds "
                    "the whole model instead")
            result.notes.append(note)
            result.summary.setdefault("warnings", []).append(note)
            if on_event is not None:
                on_event(note)
    folder = os.path.dirname(os.path.abspath(model_path))
    size = os.path.getsize(model_path) + sum(
        os.path.getsize(os.path.join(folder, loc)) for loc in external_locations(load_model(model_path, load_weights=False))
        if os.path.exists(os.path.join(folder, loc)))
    if size > ACCUMULATED_PACK_LIMIT:
        result.notes.append(f"no archive: the whole model ({size / 2**20:,.0f} MiB) is the repro of an accumulated "
                            "error; share it another way, with summary.json's attribution")
        return None
    packed = pack(model_path, target, os.path.join(result.out_dir, f"report.{fmt}"), options=options, fmt=fmt,
                  redact=redact, context={"attribution": result.summary["attribution"]}, on_event=on_event)
    result.summary["report_holds"] = "the whole model"
    return _record_report(result.out_dir, result.summary, packed, result.clock)


def _record_report(out_dir: str, summary: dict, packed, clock=None):
    """summary.json names the archive and whether its own repro.py reproduced (``clock``: the
    steps' seconds brought up to now); returns ``packed``."""
    summary["report"], summary["report_reproduces"] = packed.archive, packed.reproduces
    resources = summary.get("resources")
    if resources is not None and packed.engine_seconds:  # the archive's check ran both engines once more
        resources["engine_seconds"] = round(resources.get("engine_seconds", 0.0) + packed.engine_seconds, 3)
        resources["pack_engine_seconds"] = round(packed.engine_seconds, 3)
    if resources is not None:  # waiting for its repro.py and polygraphy runs, said apart: the seconds
        # an engine run in them was going (they recorded it) are engine time, the rest reprokit's own
        resources["pack_tool_seconds"] = packed.tool_seconds
        resources["pack_tool_engine_seconds"] = packed.tool_engine_seconds
        resources["engine_seconds"] = round(resources.get("engine_seconds", 0.0) + packed.tool_engine_seconds, 3)
    _atomic_json(os.path.join(out_dir, "summary.json"), retime(summary, clock))
    return packed


def close_summary(result) -> None:
    """The run's last write: summary.json with every step's seconds up to now (audit, overlays
    and the archive ran after the reduction returned), so the steps add up to the whole run."""
    if result.clock is not None and result.summary and os.path.exists(os.path.join(result.out_dir, "summary.json")):
        _atomic_json(os.path.join(result.out_dir, "summary.json"), retime(result.summary, result.clock))


# What a step's calls built outside packs (calls of one model each), by step (issue 39).
_ALONE = {"confirm": "original copy", "replay": "original copy", "final": "result and its replays"}


def built_by_kind(stats: dict) -> dict[str, int]:
    """Nodes built per "step: member kind" (packed calls' members, and each step's calls of one
    model): where the run's build work went."""
    found: dict[str, int] = {}
    for step, s in stats.items():
        for kind, nodes in s.built_by.items():
            found[f"{step}: {kind}"] = nodes
        alone = s.nodes_built - sum(s.built_by.values())
        if alone:
            found[f"{step}: {_ALONE.get(step, 'alone')}"] = alone
    return found
