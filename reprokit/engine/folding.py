"""Checked constant folding: a folded model is used only when it loads and computes what the
unfolded one computes on the feeds.

onnx-graphsurgeon's folding (:func:`fold_constants`) is an optimization, and on
some valid models (expanded attention and group-norm function bodies) it folds shapes from
wrong inferred shapes: onnxruntime then rejects the folded model (Reshape, Squeeze, Expand) or
computes something else. Blaming the reference for a model reprokit built is wrong, so every
folded model is run once on the reference and compared with the unfolded model's outputs;
when it fails or differs it is dropped and the caller says folding was skipped.

It sits in ``engine/``, not ``graph/``: folding runs onnxruntime in this process (through
onnx-graphsurgeon, its log lines captured by :mod:`reprokit.engine.enginelog`) and checking a
fold runs the reference in a worker process (:func:`reference_runner`). Owns no verdicts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from concurrent.futures import wait
from dataclasses import dataclass

import numpy as np

from reprokit.engine.activations import CheckCapture, tensor_bytes
from reprokit.engine.background import in_background
from reprokit.engine.enginelog import captured
from reprokit.engine.gsfold import gs_passes, infer_shapes
from reprokit.engine.ortfold import ort_fold
from reprokit.engine.worker import run_in_worker
from reprokit.errors import ReferenceFailure, ReprokitError
from reprokit.graph.index import has_bodies
from reprokit.graph.io import external_locations, save_model
from reprokit.graph.model import mark_outputs, name_unnamed_nodes, node_label
from reprokit.standalone.arrays import save_npz

SKIPPED = "constant folding skipped"


@dataclass
class Folded:
    model: object  # the folded model when it passed the check, else the model as it was
    folded: bool
    note: str = ""  # why folding was skipped (empty when it was used or there was nothing to fold)
    path: str = ""  # the folded model's file, the one the check ran (when folded)
    capture: CheckCapture | None = None  # the check's run with every node output marked (when asked)


def folding_changed(before, after) -> bool:
    """Did folding remove or replace anything? (Shape inference alone changes nothing.)"""
    if after is before:
        return False
    ops = [(n.op_type, tuple(n.input), tuple(n.output)) for n in before.graph.node]
    new_ops = [(n.op_type, tuple(n.input), tuple(n.output)) for n in after.graph.node]
    inits = sorted(t.name for t in before.graph.initializer)
    return ops != new_ops or inits != sorted(t.name for t in after.graph.initializer)


def disagreement(expected: dict, got: dict) -> str | None:
    """Why ``got`` (outputs of the folded model) is not ``expected`` (the unfolded model's), or
    None when they agree: same outputs, shapes and non-finite positions; floats within fp32
    reordering noise, everything else exactly equal."""
    for name, want in expected.items():
        if name not in got:
            return f"output {name!r} is missing"
        a, b = np.asarray(want), np.asarray(got[name])
        if a.shape != b.shape:
            return f"output {name!r} has shape {list(b.shape)} instead of {list(a.shape)}"
        if a.dtype.kind in "fc" and b.dtype.kind in "fc":
            a64, b64 = a.astype(np.complex128 if "c" in a.dtype.kind + b.dtype.kind else np.float64), b.astype(
                np.complex128 if "c" in a.dtype.kind + b.dtype.kind else np.float64)
            if not np.array_equal(np.isnan(a64), np.isnan(b64)) or not np.array_equal(a64[np.isinf(a64)],
                                                                                        b64[np.isinf(a64)]):
                return f"output {name!r} has NaN/Inf in other places"
            finite = np.isfinite(a64)
            scale = float(np.max(np.abs(a64[finite]))) if finite.any() else 0.0
            if not np.allclose(a64[finite], b64[finite], rtol=1e-4, atol=1e-6 * max(scale, 1e-30)):
                worst = float(np.max(np.abs(a64[finite] - b64[finite])))
                return f"output {name!r} differs (max abs difference {worst:.3g}, largest value {scale:.3g})"
        elif a.dtype.kind in "OSU" or b.dtype.kind in "OSU":
            if not np.array_equal(a.astype(str), b.astype(str)):
                return f"output {name!r} differs"
        elif not np.array_equal(a, b):
            return f"output {name!r} differs"
    return None


def failure_words(exc: ReprokitError) -> str:
    """The engine's own words of a reference failure, without "the reference fails on this
    model" (said of the user's model, it would be wrong for the folded copy)."""
    import re

    text = exc.message.splitlines()[0] if exc.message else ""
    return re.sub(r"^the reference \([^)]*\) fails on this model: ", "", text)[:300]


def checked_fold(model, feeds: dict, run: Callable[..., dict], workdir: str, *,
                 reference_outputs: dict | None = None, base_dir: str | None = None,
                 model_path: str | None = None, capture_within: int | None = None) -> Folded:
    """Fold ``model``'s constants and keep the result only when it agrees with ``model`` on
    ``feeds``. ``run(path, feeds)`` runs the reference and returns its outputs (raising a
    ReprokitError when the engine fails). ``reference_outputs``: the unfolded model's, when the
    caller has them already; otherwise the unfolded model is run first (when that fails, the
    model is returned unfolded and the caller's own reference run reports the user's model,
    never the folded copy) — from ``model_path`` when the caller has ``model`` in that file
    already (a Swin's 110 MB are not written a second time), else from a copy saved here.
    A large file that will fold (:func:`will_fold`) has its reference run in its worker while
    the fold runs here: the run does not depend on the fold. ``capture_within``: the folded
    model's check run marks every node output too when they fit this many bytes, and a fold
    that passes hands that run on (``Folded.capture``): a shrink's capture is then that run, not
    a third run of the reference (:class:`reprokit.engine.activations.CheckCapture`). When that
    marked run fails, the folded model is run as it is, and that run decides (and words) a refusal."""
    pending = None
    if reference_outputs is None and model_path and os.path.getsize(model_path) >= OVERLAP_BYTES and will_fold(model):
        pending = in_background("fold-check", run, model_path, feeds)
    try:
        folded = fold_constants(model, model_path)
    finally:
        if pending is not None:
            wait([pending])  # no worker outlives the fold, whatever it raised
    if not folding_changed(model, folded):
        return Folded(model, False)
    os.makedirs(workdir, exist_ok=True)
    if reference_outputs is None:
        unfolded_path = model_path or save_model(model, os.path.join(workdir, "unfolded.onnx"), base_dir=base_dir)
        try:
            reference_outputs = pending.result() if pending is not None else run(unfolded_path, feeds)
        except ReprokitError:
            return Folded(model, False)  # the model itself fails: the caller's own run says so
    marked = marked_names(folded, capture_within, workdir) if capture_within else None
    path, kept = "", None
    if marked:
        try:
            path, kept = _run_marked(folded, feeds, run, workdir, base_dir, marked)
            outputs = {name: kept.outputs[name] for name in reference_outputs if name in kept.outputs}
        except ReprokitError:
            pass  # every tensor marked may be what failed (memory, time): the plain check below decides
    try:
        if kept is None:
            path = path or save_model(folded, os.path.join(workdir, "folded.onnx"), base_dir=base_dir)
            outputs = run(path, feeds)
    except ReprokitError as exc:
        return Folded(model, False, f"{SKIPPED}: the folded model fails on the reference "
                                    f"({failure_words(exc)}); the model runs unfolded")
    why = disagreement(reference_outputs, outputs)
    if why:
        if kept is not None:
            kept.discard()
        return Folded(model, False, f"{SKIPPED}: the folded model computes something else ({why}); "
                                    "the model runs unfolded")
    return Folded(folded, True, path=path, capture=CheckCapture(kept, frozenset(marked), feeds) if kept else None)


def marked_names(model, within: int, workdir: str) -> list[str] | None:
    """Every node output of ``model``, when their tensors (estimated from static shapes, as the
    capture estimates them) fit ``within`` bytes and twice that is free on disk; else None —
    also when a tensor's size is unknown (the capture's own chunks then bound each run)."""
    names = list(dict.fromkeys(o for node in model.graph.node for o in node.output if o))
    known = _value_infos(model)
    sizes = [tensor_bytes(known[n]) if n in known else 0 for n in names]
    if not all(sizes):
        return None
    return names if sum(sizes) <= within and 2 * sum(sizes) < shutil.disk_usage(workdir).free else None


def _value_infos(folded) -> dict:
    """The folded model's value infos by name: :func:`fold_constants` inferred them already (on
    a view without the weights' bytes); inferring them again would hand the whole model to onnx."""
    return {vi.name: vi for vi in list(folded.graph.value_info) + list(folded.graph.output)}


def _run_marked(folded, feeds: dict, run, workdir: str, base_dir: str | None, marked: list[str]):
    """The folded model's check run with ``marked`` as outputs too: (the folded model's own
    file, the run's WorkerResult with its tensor file kept). The unmarked file the run's steps
    load is written while the worker runs (a Swin's is 110 MB)."""
    marked_path = save_model(mark_outputs(folded, marked, _value_infos(folded)),
                             os.path.join(workdir, "folded.marked.onnx"), base_dir=base_dir)
    fetched = marked + [o.name for o in folded.graph.output if o.name not in set(marked)]  # an output no node makes
    pending = in_background("fold-check", run, marked_path, feeds, marked=fetched)
    try:
        path = save_model(folded, os.path.join(workdir, "folded.onnx"), base_dir=base_dir)
    finally:
        wait([pending])
        os.remove(marked_path)
    return path, pending.result()


# A model file this large has the unfolded model's reference run beside the fold (checked_fold);
# smaller ones fold in a moment and run one after the other, as before
OVERLAP_BYTES = 8 << 20
_NOT_FOLDED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                         "Bernoulli"})


def will_fold(model) -> bool:
    """Does a node other than a Constant compute from constants alone (initializers that are not
    inputs, Constant outputs, and what those compute)? Then folding changes the model, and the
    unfolded model's reference run is needed; a guess only for when to start that run, never for
    what is folded."""
    known = {t.name for t in model.graph.initializer} - {i.name for i in model.graph.input}
    for node in model.graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in known for name in inputs) and not has_bodies(node)
                                          and node.op_type not in _NOT_FOLDED):
            if node.op_type != "Constant":
                return True
            known.update(node.output)
    return False


def reference_runner(spec: str, workdir: str, *, timeout: float = 600.0, weights_dir: str | None = None):
    """``run(path, feeds) -> outputs`` on the reference ``spec`` through a worker process; an
    engine failure raises ReferenceFailure (the caller decides whom it concerns). ``run.seconds``:
    the seconds its runs took so far."""
    counter = [0]

    def run(path: str, feeds: dict, marked: list[str] | None = None):
        """The outputs as arrays; ``marked``: those tensors as outputs, and the WorkerResult
        itself returned, its tensor file kept (the caller discards or hands it on)."""
        counter[0] += 1
        job = os.path.join(workdir, f"fold-check-{counter[0]}")
        os.makedirs(job, exist_ok=True)
        feeds_path = save_npz(os.path.join(job, "feeds.npz"), feeds)
        result = run_in_worker(spec, path, feeds_path, job, timeout=timeout, weights_dir=weights_dir,
                               output_names=marked)
        run.seconds += result.seconds
        if result.status != "ok":
            result.discard()
            raise ReferenceFailure(f"{result.status}: {result.message}")
        if marked:
            return result
        outputs = {k: np.array(v) for k, v in result.outputs.items()}
        result.discard()
        return outputs

    run.seconds = 0.0  # the worker processes' seconds: engine time, for the caller's accounts
    return run


# Models shrink does not fold by default (their folding changes what the engine is asked to
# build): Q/DQ pairs on weights would fold into plain float weights, and onnx-graphsurgeon
# flattens If nodes whose condition is constant (control flow is opened its own way: opening.py).
_KEPT_UNFOLDED = frozenset({"QuantizeLinear", "DequantizeLinear", "If", "Loop", "Scan"})
NO_FOLD_HINT = "--no-fold-constants reduces the model as given"


def fold_prepared(model, path: str, feeds: dict, options, workdir: str, base_dir: str, notes: list[str],
                  spent: list[float] | None = None, capture_within: int | None = None):
    """Fold the model's constants when the folded one agrees with it on the reference
    (``session.prepare``): the frozen model of ``--input-shapes``, and shrink's model by default
    (polygraphy's ``surgeon sanitize --fold-constants``; node names stay the user's, so a folded
    minimal model names the user's nodes). Returns the model and the file engines load — never
    the user's own file rewritten; says in ``notes`` what was done and adds the check's
    reference runs' seconds to ``spent`` (engine time, not reprokit's own). ``capture_within``:
    see :func:`checked_fold`; the folded model's marked check run is returned third when the
    folded model is the one returned (else None: it was discarded)."""
    frozen = f"froze input shapes {options.input_shapes}" if options.input_shapes else ""
    kept = sorted({n.op_type for n in model.graph.node} & _KEPT_UNFOLDED)
    if external_locations(model) or (kept and not frozen):
        if frozen:
            notes.append(frozen)
        return model, path, None
    run = reference_runner(options.reference, os.path.join(workdir, "fold-check"), timeout=options.timeout,
                           weights_dir=base_dir)
    # ``path`` holds ``model`` as it is (the user's file, or the frozen copy just saved)
    result = checked_fold(model, feeds, run, os.path.join(workdir, "fold-check"), base_dir=base_dir, model_path=path,
                          capture_within=capture_within)
    if spent is not None:
        spent.append(run.seconds)
    model, path, used = _chosen(model, path, result, frozen, notes, workdir)
    if result.capture is not None and not used:
        result.capture.discard()  # the model runs unfolded: the folded model's capture is no capture of it
    return model, path, result.capture if used else None


def _chosen(model, path: str, result: Folded, frozen: str, notes: list[str], workdir: str):
    """After the fold's check: the model the run goes on with, its file, and whether it is the
    folded one."""
    if result.folded and not frozen and _only_constant_nodes(model, result.model):
        # nothing computed folds, Constant nodes would only become initializers: an engine builds
        # the same, and the user's Constant node (a clamped -inf, say) stays a node it can name
        return model, path, False
    if result.folded and not frozen and _outputs_folded(model, result.model):
        # every output constant (a model with no inputs): the engine would compute nothing
        notes.append(f"{SKIPPED}: it would turn the model's outputs into constants; the model runs unfolded")
        return model, path, False
    if result.folded:
        before, after = len(model.graph.node), len(result.model.graph.node)
        notes.append(frozen + " and folded constants" if frozen else
                     f"constants folded before the survey ({before} → {after} nodes, as polygraphy's surgeon "
                     f"sanitize --fold-constants does; node names are the model's own): {NO_FOLD_HINT}")
        prepared = os.path.join(workdir, "prepared.onnx")
        os.replace(result.path, prepared)  # the folded model's file (its check ran it or a marked copy): saved once
        return result.model, prepared, True
    if frozen or result.note:
        notes.append("; ".join(filter(None, [frozen, result.note])))
    return model, path, False


def _only_constant_nodes(before, after) -> bool:
    """Did folding remove nothing but Constant nodes?"""
    kept = {n.name for n in after.graph.node}
    return all(n.op_type == "Constant" for i, n in enumerate(before.graph.node)
               if node_label(n, i) not in kept)


def _outputs_folded(before, after) -> bool:
    """Did folding turn a graph output some node computed into a constant?"""
    made = {o for n in before.graph.node for o in n.output}
    still = {o for n in after.graph.node for o in n.output}
    return any(o.name in made and o.name not in still for o in after.graph.output)


def fold_constants(model, source_path: str | None = None):
    """Constant folding, opset and IR kept: onnxruntime's own constant folding alone (one
    session built with every other basic rewrite disabled, the folded graph written out), and
    where that is not a pure fold (:func:`reprokit.engine.ortfold.pure_fold`: a rewrite this list does not name, a body
    changed) or onnxruntime cannot load the model, onnx-graphsurgeon's passes as polygraphy's
    sanitize runs them. Models whose weights stay on disk (external data) are left unfolded:
    folding would pull every weight into memory. Unnamed nodes are named by :func:`node_label`
    first, so the folded model keeps the names (and ``fp32-nodes=`` labels) of the model it came
    from (:func:`reprokit.graph.model.node_label`). ``source_path``: a file holding ``model`` as
    it is, which onnxruntime then reads itself (a Swin's 110 MB are not serialized for it).

    Folding is an optimization that can get shapes wrong (onnx-graphsurgeon folded some from
    wrong inferred shapes): callers that run the result check it against the unfolded model
    (:func:`checked_fold`)."""
    import onnx

    if external_locations(model):
        return model
    ir_version, opsets = model.ir_version, list(model.opset_import)
    named = onnx.ModelProto()  # a private copy: half the time of parsing the file again (a Swin: 0.25 s)
    named.CopyFrom(model)
    if name_unnamed_nodes(named):
        source_path = None  # onnxruntime must see the names given here
    # the fold's engines log to the run's log (reprokit.engine.enginelog), never to the console;
    # warnings about the folding's own constant subgraphs say nothing about the user's engine
    with captured("constant folding (onnxruntime in process)"):
        folded = ort_fold(onnx, named, source_path)
        if folded is None:
            folded = gs_passes(onnx, named)
    if folded is None:  # folding is an optimization: keep the model as it was
        return model
    folded.ir_version = ir_version
    del folded.opset_import[:]
    folded.opset_import.extend(opsets)
    try:
        folded = infer_shapes(onnx, folded)
    except Exception:
        pass
    return folded
