"""``reprokit audit``: why a model diverges under a target and which setting avoids it.

One reference run captures every tensor; from it the range audit (:mod:`.ranges`) names the
tensors and weights the target's narrow type cannot hold, with no target call. One target run
gives the layerwise error table; the knob sweep and the random-inputs/random-weights explain
(:mod:`.sweep`) are one target call per setting. :mod:`.output` writes audit.json, audit.md,
audit.html and layerwise.png; :mod:`.suspects` says which nodes to suspect. Knows nothing of
click; raises ReprokitError subclasses only.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from reprokit.audit import calibration
from reprokit.audit.calls import Ledger
from reprokit.audit.layernorm import fuse_layernorms
from reprokit.audit.output import write_outputs
from reprokit.audit.ranges import RangeReport, audit_ranges
from reprokit.audit.suspects import amplifiers
from reprokit.audit.suspects import suspects as find_suspects
from reprokit.audit.sweep import (
    NOT_APPLICABLE,
    Bench,
    SweepRow,
    explain,
    plan,
    run_setting,
    workaround,
)
from reprokit.engine import floatref, quantized
from reprokit.engine.folding import (
    SKIPPED,
    disagreement,
    failure_words,
    fold_constants,
    folding_changed,
)
from reprokit.engine.inputs import feed_dtype, feed_shape
from reprokit.engine.layerwise import (
    LayerwiseReport,
    compare_marked_run,
    divergence_start,
    float_node_outputs,
)
from reprokit.engine.oracle import check_reference_finite
from reprokit.engine.session import RunOptions, admit_target, make_oracle, prepare
from reprokit.errors import ReprokitError
from reprokit.graph.index import inferred_value_info
from reprokit.graph.io import save_model
from reprokit.graph.model import (
    check_target_nodes,
    freeze_input_shapes,
    mark_outputs,
    name_unnamed_nodes,
    node_labels,
)
from reprokit.shrink.fp32_nodes import fp32_nodes_support
from reprokit.shrink.pipeline import isolated_attribution
from reprokit.shrink.precision import Search, find_workaround
from reprokit.spec import parse_target

SCHEMA = "reprokit.audit/1"
REFERENCE_ITSELF = ("that is the reference itself: it agrees by definition, so it is no workaround "
                    "(not run)")
__all__ = ["SCHEMA", "AuditResult", "audit"]


@dataclass
class AuditResult:
    payload: dict  # audit.json
    out_dir: str | None
    files: dict  # kind -> path written
    sweep: list[SweepRow]
    ranges: RangeReport
    layerwise: object  # reprokit.engine.layerwise.LayerwiseReport
    verdict: object  # reprokit.engine.oracle.Verdict

    @property
    def workaround(self) -> dict | None:
        return self.payload.get("workaround")

    def issue_context(self) -> dict:
        """ISSUE.md's "what we tried" list (rows with setting, verdict, error) and the smallest
        workaround, for the report archive's context."""
        extra = {"layernorm": " + one LayerNormalization node per LayerNorm (opset 17)",
                 "batch": " + the batch dim " + ("dynamic" if any(r.change.startswith("dynamic") for r in self.sweep)
                                                 else "static")}
        rows = [{"setting": r.setting + extra.get(r.key, ""), "verdict": r.verdict, "error": r.error}
                for r in self.sweep if r.verdict != "not applicable"]
        found = self.workaround
        words = (f"{found['change']} (`{found['setting']}` → {found['verdict']}, {found['basis']})"
                 if found else "")
        return {"sweep": rows, "workaround": words}


class _Weights(Mapping):
    """Initializers by name, read one at a time (external data stays on disk until asked)."""

    def __init__(self, model, base_dir: str):
        self._protos = {t.name: t for t in model.graph.initializer}
        self._base_dir = base_dir

    def __getitem__(self, name):
        from onnx import numpy_helper

        return numpy_helper.to_array(self._protos[name], self._base_dir)

    def __iter__(self):
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)


def audit(model_path: str, target: str, out_dir: str | None = None, *, options=None, sweep: bool = True,
          explain_inputs: bool = True, ranges_only: bool = False, kept_nodes: list[str] | None = None,
          on_event=None) -> AuditResult:
    """Audit ``model_path`` under ``target``; write the report files to ``out_dir`` when given.

    ``ranges_only``: the range audit alone — one reference call, no target call, no engine
    build (the target spec only says which narrow type to audit against)."""
    options = options or RunOptions()
    float_model = options.reference_model  # a quantized MODEL's float original (engine/floatref.py)
    options = dataclasses.replace(options, reference_model=None)
    event = on_event or (lambda text: None)
    started = time.monotonic()
    ledger = Ledger()
    with tempfile.TemporaryDirectory(prefix="reprokit-audit-") as work:
        oracle = make_oracle(target, options, os.path.join(work, "calls"))
        check_target_nodes(model_path, target)
        admit_target(model_path, target)
        prepared = prepare(model_path, options, work)
        oracle.weights_dir = prepared.base_dir
        quantized.judge_with(oracle, prepared.model, options, command="audit")  # a quantized model: judged in steps
        user = floatref.for_audit(prepared.model, float_model) if float_model else None
        notes = list(prepared.notes)
        feeds = prepared.feeds.arrays
        # Every target call of the verdict and the sweep runs the model as given (the user's
        # file, or its --input-shapes copy): what `reprokit check --target SETTING` runs.
        path = prepared.path
        model, marked, tensors, activations, reference, graph_outputs = _capture(oracle, ledger, prepared, work,
                                                                                 notes, event)
        check_reference_finite(reference, oracle.reference)

        event("range audit (no target call)")
        constants = _Weights(model, prepared.base_dir)
        ranges = audit_ranges(model, activations, constants, feeds, oracle.precision, oracle.criterion.tolerance)

        if ranges_only:
            verdict = None
            layer = LayerwiseReport([], False, ["not run (--ranges-only)"])
        else:
            event(f"running {target} on the model")
            verdict = oracle.verdict_from(ledger.run("verdict", "target", oracle, "the model as given", path, feeds),
                                          reference)
            event(f"verdict: {verdict.signature.describe() if verdict.diverges else 'agree'}; layerwise run")
            layer = _layerwise(oracle, ledger, model, marked, feeds, graph_outputs + tensors, activations, target)

        isolated = None
        if verdict is not None and verdict.diverges and verdict.kind.value in ("nonfinite", "mismatch"):
            event("each node alone, fed with the reference activations (packed)")
            started_isolated = time.monotonic()
            before = oracle.stats.target
            isolated = isolated_attribution(model, activations, feeds, oracle, verdict.signature,
                                            os.path.join(work, "isolated"), lambda i: model.graph.node[i].name)
            for _ in range(oracle.stats.target - before):
                ledger.add("isolated", "target", oracle.target, "every node alone (packed)",
                           (time.monotonic() - started_isolated) / max(1, oracle.stats.target - before))
        suspects = find_suspects(model, ranges, layer, verdict, isolated)
        bench = Bench(model, path, feeds, reference, options, work, ledger, prepared.base_dir)
        rows: list[SweepRow] = []
        explained = None
        diverges = verdict is not None and verdict.diverges
        tested = None
        if isolated is not None and sweep:
            event("the fewest ranked nodes that, kept in fp32, bring the model within tolerance")
            tested = _tested_workaround(prepared, path, feeds, reference, target, options, work, ledger, isolated,
                                        event)
        if diverges and sweep:
            rows = _sweep(bench, target, verdict, suspects, prepared, event, oracle.reference,
                          nodes_fixed=bool(tested and tested.agrees))
            if tested is not None and tested.setting:
                rows.insert(0, _tested_row(tested))
        if diverges and explain_inputs:
            event("explain: random inputs, random weights")
            explained = explain(bench, oracle, verdict.signature, seed=options.seed + 1)
        payload = _payload(model, model_path, target, oracle, prepared, notes, verdict, ranges, layer, suspects,
                           rows, explained, kept_nodes, ledger, started, sweep)
        payload["isolated"] = isolated
        diagnosis = calibration.diagnose(oracle, prepared.model, feeds, os.path.join(work, "calibration"), event,
                                         float_model=user)
        payload["calibration"] = diagnosis.to_json() if diagnosis is not None else None
        # beside "precision" (the target's: fp16), never over it: audit.md printed this dict there
        payload["tested_workaround"] = tested.to_json() if tested is not None else None
        payload["divergence_start"] = divergence_start(layer, isolated["diverging_nodes"] if isolated else None)
        files = {}
        if out_dir:
            files = write_outputs(payload, layer, ranges, out_dir)
    return AuditResult(payload, out_dir, files, rows, ranges, layer, verdict)


def _capture(oracle, ledger, prepared, work, notes, event):
    """Every float tensor captured on the reference, from the model with its constants folded
    when that folded model computes what the model as given computes (checked: one reference
    run of the model as given), else from the model unfolded. Unnamed nodes carry their
    OP_INDEX labels of the user's file (:func:`reprokit.graph.model.node_label`) either way.
    Returns (model, marked model file, marked tensors, activations, reference outputs of the
    model as given, graph outputs)."""
    import onnx

    given = onnx.ModelProto.FromString(prepared.model.SerializeToString())
    named = name_unnamed_nodes(given)
    if named:
        example = next(n.name for n in given.graph.node if n.name and n.name not in
                       {m.name for m in prepared.model.graph.node})
        notes.append(f"{named} unnamed node{'s are' if named > 1 else ' is'} shown as OP_INDEX, the op type and "
                     f"position in the model file (e.g. {example}); fp32-nodes= takes these names")
    folded = fold_constants(given)
    expected = None
    if folding_changed(given, folded):
        event("running the model as given on the reference (checks the constant folding)")
        run = ledger.run("capture", "reference", oracle, "the model as given (checks constant folding)",
                         prepared.path, prepared.feeds.arrays)
        expected = dict(run.outputs)
        check_reference_finite(expected, oracle.reference)
    candidates = [(folded, "folded")] if expected is not None else []
    candidates.append((given, "as given"))
    graph_outputs = [o.name for o in given.graph.output]
    for model, kind in candidates:
        tensors = [t for t, *_ in float_node_outputs(model) if t not in graph_outputs]
        # Non-float tensors too (shapes, indices): an unfolded model's isolated nodes read them.
        known = inferred_value_info(model)
        others = [t for n in model.graph.node for t in n.output if t and t not in graph_outputs and t not in tensors
                  and t in known and known[t].type.HasField("tensor_type")]
        marked = save_model(mark_outputs(model, tensors + others),
                            os.path.join(work, f"marked-{kind.replace(' ', '-')}.onnx"), base_dir=prepared.base_dir)
        event("capturing every tensor on the reference (one call)")
        try:
            capture = ledger.run("capture", "reference", oracle, f"every tensor of the model ({kind})", marked,
                                 prepared.feeds.arrays, graph_outputs + tensors + others)
        except ReprokitError as exc:
            if kind == "as given":
                raise
            notes.append(f"{SKIPPED}: the folded model fails on the reference ({failure_words(exc)}); "
                         "the model is audited unfolded")
            continue
        activations = dict(capture.outputs)
        outputs = {n: activations[n] for n in graph_outputs if n in activations}
        why = disagreement(expected, outputs) if kind == "folded" else None
        if why:
            notes.append(f"{SKIPPED}: the folded model computes something else ({why}); the model is audited unfolded")
            continue
        return model, marked, tensors, activations, (expected if expected is not None else outputs), graph_outputs
    raise AssertionError("unreachable: the model as given either captures or raises")


def _layerwise(oracle, ledger, model, marked, feeds, names, activations, target):
    result = ledger.run("layerwise", "target", oracle, "every tensor marked as an output", marked, feeds, names)
    return compare_marked_run(model, activations, result, oracle)


def _tested_workaround(prepared, path, feeds, reference, target, options, work, ledger, isolated, event):
    """The precision search (:mod:`.precision`) over the isolated ranking, on the model as given;
    None where the target has no per-node precision (the sweep's fp32-nodes row says why)."""
    if not fp32_nodes_support(target)[0]:
        return None
    labels = node_labels(prepared.model)
    ranked = [n for n in isolated.get("ranking", []) if n in labels]
    search = Search(prepared.model, path, feeds, reference, target,
                    lambda spec: make_oracle(spec, options, os.path.join(work, "precision-calls")),
                    os.path.join(work, "precision"), weights_dir=prepared.base_dir, ledger=ledger, on_event=event)
    return find_workaround(search, ranked)


def _tested_row(found) -> SweepRow:
    """The search's answer as a sweep row: the printed setting and the verdict of its own run."""
    return SweepRow("fp32-nodes", f"keep {len(found.nodes)} node{'s' if len(found.nodes) != 1 else ''} in fp32 "
                    f"(searched over the {found.ranked} nodes ranked by their own error, {found.calls} target calls)",
                    1, found.setting, found.verdict, found.error, found.tolerance, fixes=found.agrees,
                    target_calls=found.calls, note=found.note)


def _sweep(bench, target, verdict, suspects, prepared, event, reference: str, nodes_fixed: bool = False) -> list[SweepRow]:
    fused, matches = fuse_layernorms(bench.model, bench.base_dir)
    if matches:
        bench.variants["layernorm"] = save_model(fused, os.path.join(bench.workdir, "layernorm.onnx"))
        removed = len(bench.model.graph.node) - len(fused.graph.node)
        words = (f"{len(matches)} decomposed LayerNorm{'s' if len(matches) > 1 else ''} rewritten as one "
                 f"LayerNormalization node each (opset 17; {removed} fewer nodes)")
    else:
        words = "no decomposed LayerNorm (ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div) in the model"

    batch = _batch_variant(bench, prepared)
    # Only names of the user's model are offered (its node names, OP_INDEX for unnamed ones).
    labels = node_labels(prepared.model)
    candidates = [c for c in suspects["candidates"] if all(n in labels for n in c)]
    settings = plan(target, candidates, (bool(matches), words), batch)
    rows: list[SweepRow] = []
    for setting in sorted(settings, key=lambda s: s.rank):
        if setting.key == "fp32-nodes" and nodes_fixed:
            continue  # a smaller set of nodes already avoids it
        if setting.target == target and setting.model == "original":
            continue
        if setting.target and setting.model == "original" and str(parse_target(setting.target)) == reference:
            # The reference agrees with itself by definition: no workaround, and no call spent.
            rows.append(SweepRow(setting.key, setting.change, setting.rank, f"{setting.target} (the reference)",
                                 NOT_APPLICABLE, note=REFERENCE_ITSELF))
            continue
        event(f"sweep: {setting.change}" + (f" ({setting.target})" if setting.target else " — not applicable"))
        row = run_setting(bench, setting, verdict.signature, verdict.criterion)
        nodes_fixed = nodes_fixed or (setting.key == "fp32-nodes" and row.fixes)
        rows.append(row)
    return rows


def _batch_variant(bench, prepared):
    """For TensorRT: the model with its batch dim made static (if dynamic) or dynamic (if static)."""
    dims = [i.shape[0] for i in prepared.infos if len(i.shape) >= 2]
    if not dims:
        return None
    shapes = {k: tuple(np.shape(v)) for k, v in bench.feeds.items()}
    if all(isinstance(d, int) and d > 0 for d in dims):
        import onnx

        model = onnx.ModelProto.FromString(bench.model.SerializeToString())
        for vi in list(model.graph.input) + list(model.graph.output):
            if len(vi.type.tensor_type.shape.dim) >= 2:
                vi.type.tensor_type.shape.dim[0].Clear()
                vi.type.tensor_type.shape.dim[0].dim_param = "batch"
        del model.graph.value_info[:]
        bench.variants["dynamic-batch"] = save_model(model, os.path.join(bench.workdir, "dynamic-batch.onnx"))
        return "dynamic-batch", "dynamic batch dim (profile pinned to the feed shapes) instead of static"
    frozen = freeze_input_shapes(bench.model, shapes)
    bench.variants["static-batch"] = save_model(frozen, os.path.join(bench.workdir, "static-batch.onnx"))
    return "static-batch", "static input shapes (batch frozen to the feeds) instead of dynamic"


def _no_workaround(rows, target: str, reference: str) -> str:
    """What to say when no setting tried avoids the divergence."""
    if any(r.note == REFERENCE_ITSELF for r in rows):
        return (f"only full fp32 avoids it: no setting of {target} tried agrees, and full fp32 here is the "
                f"reference itself ({reference})")
    if all(r.verdict == "not applicable" for r in rows):  # a cmd check: reprokit knows none of its settings
        return f"no setting was tried: none of the sweep's settings applies to {target}"
    return "none of the settings tried avoids it"


def _payload(model, model_path, target, oracle, prepared, notes, verdict, ranges, layer, suspects, rows, explained,
             kept_nodes, ledger, started, swept) -> dict:
    found, basis = workaround(rows)
    first = layer.first[0] if layer.first else None
    minimal = None
    if kept_nodes is not None:
        named = set(suspects["range_region"]) | set(suspects["layerwise_first"]) | set(suspects["kind_starts"])
        minimal = {"node_names": list(kept_nodes), "among_suspects": sorted(set(kept_nodes) & named),
                   "range_first": ranges.first.node if ranges.first else None}
    not_run = []
    if verdict is None:
        not_run.append("range audit only (--ranges-only): no target call, no layerwise, sweep or explain")
    elif not verdict.diverges:
        not_run.append(f"the model does not diverge under {target}: no sweep and no explain")
    elif not swept:
        not_run.append("sweep skipped (--no-sweep)")
    return {
        "schema": SCHEMA, "model": model_path, "target": target, "reference": oracle.reference,
        "precision": oracle.precision,
        "criterion": {"metric": oracle.criterion.metric.value, "tolerance": oracle.criterion.tolerance,
                      "text": oracle.criterion.describe()},
        "feeds": {"source": prepared.feeds.source,
                  "inputs": {k: {"shape": feed_shape(v), "dtype": feed_dtype(v)}
                             for k, v in prepared.feeds.arrays.items()}},
        "notes": notes + not_run,
        "verdict": verdict.to_json() if verdict is not None else None,
        "ranges": ranges.to_json(),
        "weights": {"checked": ranges.weights_checked, "flagged": [w.to_json() for w in ranges.weights]},
        "layerwise": {"compared": len(layer.rows), "diverging": len(layer.diverging),
                      "first": first.to_json() if first else None,
                      "first_rows": [r.to_json() for r in layer.first[:10]],
                      "marking_changes_engine": layer.marking_changes_engine,
                      "missing_in_target": layer.missing[:20], "amplifiers": amplifiers(model, layer),
                      "rows": [r.to_json() for r in layer.rows]},
        "suspects": suspects,
        "sweep": [r.to_json() for r in rows],
        "workaround": {**found.to_json(), "basis": basis} if found else None,
        "no_workaround": _no_workaround(rows, target, oracle.reference) if rows and not found else None,
        "explain": explained,
        "minimal": minimal,
        "calls": [c.to_json() for c in ledger.calls],
        "cost": ledger.summary(),
        "wall_s": round(time.monotonic() - started, 3),
    }
