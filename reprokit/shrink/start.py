"""The start of a shrink run, before anything is judged: its state folder, oracle, model and
feeds, the input sample it reduces on, control flow opened where the model has some
(``opening.py``), and the reference activations captured to disk.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field

from reprokit.engine import floatref, quantized, twinrun
from reprokit.engine.activations import ActivationStore, CheckCapture, tensor_bytes
from reprokit.engine.backends import backend_class
from reprokit.engine.recall import verdict_from_json
from reprokit.engine.session import RunOptions, admit_target, make_oracle, prepare
from reprokit.errors import InputError
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import external_locations, save_model, weight_bytes, weights_apart
from reprokit.graph.model import check_target_nodes, mark_outputs, name_unnamed_nodes
from reprokit.shrink.opening import open_levels
from reprokit.shrink.reducer import Journal
from reprokit.shrink.runstate import STATE_DIR, _check_same_run, _with_timing_cache
from reprokit.shrink.samples import choose_sample
from reprokit.spec import parse_target


@dataclass
class _Run:
    """What every step of one shrink run shares."""

    model_path: str
    target: str  # the user's target, plus the run's private timing cache for TensorRT
    user_target: str
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
    given: object = None  # the model as given (run.model may have its control flow opened)
    levels: list = field(default_factory=list)  # (model, notes) per level of opened control flow
    shrink_shapes: bool = True  # halve the result's input shapes while the signature holds
    refused: bool = False  # the Identity probe failed alike: the check does not depend on the model
    probe_calls: int = 0  # what a check command adds to the auto budget: the calibration, the probe reserved
    probed: bool = False  # the Identity probe ran (once a run: its answer does not change)

    @property
    def feeds(self) -> dict:
        return self.prepared.feeds.arrays


def open_run(model_path, target, out_dir, options, resume, event, clock, run_args=(), search=None,
             capture_within: int | None = None) -> _Run:
    """State folder, oracle, model and feeds. Constant subgraphs are folded first, as polygraphy's
    ``surgeon sanitize --fold-constants`` does (``search["fold_constants"]``, on by default; the
    folded model is used only when the reference computes the same with it, and keeps the user's
    node names); the confirming call then judges the folded model the search reduces.
    ``capture_within``: the capture's bound on one run's tensors; a folded model's check run whose
    tensors fit it marks them all and is the capture (:func:`capture`), not a run of its own."""
    started = time.monotonic()
    state_dir = os.path.join(out_dir, STATE_DIR)
    if not resume and os.path.exists(os.path.join(state_dir, "journal.jsonl")):
        raise InputError(f"{out_dir} already holds a shrink run",
                         hint=f"continue it with --resume {shlex.quote(out_dir)}, or choose another -o directory")
    os.makedirs(state_dir, exist_ok=True)
    user_target = target
    target = _with_timing_cache(target, state_dir)
    floatref.refuse_outside_check(model_path, options.reference_model, "shrink")
    converted = model_path if options.reference_model else None
    judged = options.reference_model or model_path  # --reference-model: cuts are made of the fp32 model
    oracle = make_oracle(target, options, os.path.join(state_dir, "calls"), target_model=converted)
    check_target_nodes(judged, target)
    admit_target(model_path, target)
    fold = (search or {}).get("fold_constants", True) and not converted and parse_target(target).engine != "cmd"
    captured = resume and os.path.exists(os.path.join(state_dir, "activations", ActivationStore.INDEX))
    prepared = prepare(judged, options, state_dir, every_sample=True, fold=fold,
                       capture_within=None if captured else capture_within)
    oracle.stats.reference_seconds += prepared.reference_seconds  # the fold's check ran the reference
    if converted:
        prepared.notes.append(twinrun.attach(oracle, prepared.model, prepared.path, converted))
    _check_same_run(state_dir, model_path, user_target, options, prepared.feeds.arrays, oracle, resume, run_args,
                    search)
    keep_verdicts(oracle, os.path.join(state_dir, "verdicts.jsonl"), resume)
    # Every model file of this run lives in models/; external weights stay where they are and
    # every engine call is told so (oracle.weights_dir): candidates never copy them.
    oracle.weights_dir = prepared.base_dir
    quantized.judge_with(oracle, prepared.model, options, command="shrink")  # a quantized model: tensors judged in steps
    models_dir = os.path.join(state_dir, "models")
    os.makedirs(models_dir, exist_ok=True)
    model = prepared.model
    # An unnamed node is named by its OP_INDEX in the user's file (fp32-nodes= names it so); a
    # candidate is another file with other positions, so every node carries its label from here
    # on, and the minimal model and the summary name the user's node (folding named them first).
    name_unnamed_nodes(model)
    if not converted and _reads_weights_dir(target, options.reference):
        model = weights_apart_for_run(prepared, model, oracle, models_dir)
    choose_sample(oracle, prepared, model, models_dir, event)  # several input samples: the first failing one
    given = model
    clock.begin("opening")
    levels = open_levels(model, oracle, prepared.feeds.arrays, models_dir, event, prepared.path)
    if levels:  # capture on the deepest opening: it holds every tensor of the shallower ones
        model = levels[-1][0]
        if prepared.check_capture is not None:
            prepared.check_capture.discard()  # the folded model's tensors, not the opened one's
    event("capturing reference activations")
    return _Run(model_path, target, user_target, options, out_dir, state_dir, models_dir, oracle, prepared, model,
                GraphIndex.build(model), Journal(os.path.join(state_dir, "journal.jsonl")), event, started,
                given, levels)


# A model with this many bytes of inline weights is reduced with its weights in one file of the
# run's (below): every candidate, pack and call then references them instead of copying them
LIGHT_WEIGHT_BYTES = 8 << 20
WEIGHTS_FILE = "model.weights"


def _reads_weights_dir(target: str, reference: str) -> bool:
    """Do both engines read external weights from the folder they are told (onnxruntime, the
    emulator)? The others get hard links staged beside each call's file, which onnx's own loader
    refuses (TensorRT's strongly typed conversion loads the file with onnx), and a check script
    may read only whole files: for them the model keeps its weights inline."""
    return all(backend_class(parse_target(spec).engine).reads_weights_dir for spec in (target, reference))


def weights_apart_for_run(prepared, model, oracle, models_dir: str):
    """The model the run reduces, its inline weights written once to ``models_dir/weights/``
    (:func:`reprokit.graph.io.weights_apart`) and referenced from there: each candidate's
    extraction, each pack and each model file written for a worker then holds references, not
    bytes (a 3,647-node Swin: 110 MB copied into every extraction and serialized into every pack
    and call). Engines are told the folder (``oracle.weights_dir``), as for a user's own external
    data; results that travel (minimal.onnx, the window, the archive) are saved self-contained
    from it. Kept inline: a model with external data of its own (already referenced), a
    quantized one (its scales are read as values), one with little to gain; the caller keeps
    it inline for engines that do not read weights from a folder (:func:`_reads_weights_dir`)."""
    if (external_locations(model) or weight_bytes(model) < LIGHT_WEIGHT_BYTES
            or any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)):
        return model
    folder = os.path.join(models_dir, "weights")
    os.makedirs(folder, exist_ok=True)
    light = weights_apart(model, os.path.join(folder, WEIGHTS_FILE))
    prepared.model, prepared.base_dir = light, folder
    oracle.weights_dir = folder
    return light


def keep_verdicts(oracle, path: str, resume: bool) -> None:
    """Every verdict the oracle judges is kept in ``path``; a resumed run (the same one: its
    fingerprint was checked) gives them back, so a call made before an interrupt — the
    confirming call, control flow's openings, the final judgement — is answered without a call
    and counted as cached, not charged to the budget twice."""
    if not resume and os.path.exists(path):
        os.remove(path)  # another run's (an -o reused with --force): not this one's
    verdicts = Journal(path)
    for key, entry in verdicts.entries.items():
        try:
            oracle.recall(key, verdict_from_json(entry["verdict"], oracle.criterion))
        except (KeyError, TypeError, ValueError):
            continue  # a line this version cannot read: that call is simply made again
    oracle.remember = lambda key, verdict: verdicts.put(key, {"verdict": json.loads(json.dumps(
        verdict.to_json(), default=str))})  # an engine's metadata may hold what JSON cannot


def capture(oracle, model, index, feeds, names, state_dir, models_dir, resume, limits, event,
            checked: CheckCapture | None = None) -> ActivationStore:
    """Every node output of the reference, on disk, in as many runs as the memory budget needs.
    ``checked``: the folded model's check run with every node output marked (``model`` is that
    folded model, its control flow not opened); when the capture is that one run of the same
    tensors on the same feeds, it is taken, not run again (counted as the capture's reference
    call; its seconds were counted with the fold's check)."""
    capture_dir = os.path.join(state_dir, "activations")
    try:
        if resume and os.path.exists(os.path.join(capture_dir, ActivationStore.INDEX)):
            return ActivationStore.open(capture_dir)
        sizes = {n: tensor_bytes(index.value_info[n]) for n in names if n in index.value_info}

        def run_chunk(chunk):
            taken = checked.take(chunk, feeds) if checked is not None else None
            if taken is not None:
                oracle.stats.reference += 1
                return taken
            path = save_model(mark_outputs(model, chunk), os.path.join(models_dir, "capture.onnx"))
            return oracle.run_reference(path, feeds, chunk)

        return ActivationStore.capture(run_chunk, names, sizes, capture_dir, chunk_bytes=limits.capture_chunk_bytes,
                                       max_disk_bytes=limits.max_activation_disk_bytes, on_event=event)
    finally:
        if checked is not None:
            checked.discard()  # a run no chunk took
