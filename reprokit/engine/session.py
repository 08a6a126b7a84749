"""A model made ready to run and judged: prepare a model and its feeds, build the oracle from
the run's options, run ``check`` (a verdict per sample). The engine wing's top: shrink, audit and
report build on it; :mod:`reprokit.api` re-exports it as the library's entry points. Knows nothing
of click, passes or archives; raises ReprokitError subclasses only.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from dataclasses import dataclass, field

import numpy as np

from reprokit.engine import floatref, quantized, twinrun
from reprokit.engine.backends import backend_class
from reprokit.engine.backends.base import Backend
from reprokit.engine.feedfiles import load_feeds, load_samples
from reprokit.engine.folding import fold_prepared
from reprokit.engine.inputs import Feeds, random_feeds
from reprokit.engine.layerwise import run_layerwise
from reprokit.engine.oracle import Oracle, Verdict, check_reference_finite
from reprokit.errors import InputError, UsageError
from reprokit.graph import dims
from reprokit.graph.io import load_model, save_model
from reprokit.graph.model import InputInfo, check_target_nodes, freeze_input_shapes, input_infos
from reprokit.graph.validity import check_valid
from reprokit.spec import marking_changes_engine, parse_target
from reprokit.standalone.checkpolicy import CheckPolicy
from reprokit.standalone.compare import Criterion


@dataclass
class Prepared:
    """A model ready to run: the file engines read, its inputs and the feeds to use."""

    model: object  # onnx.ModelProto with weights
    path: str  # file the engines load (the user's own file when nothing had to change)
    infos: list[InputInfo]
    feeds: Feeds
    notes: list[str] = field(default_factory=list)
    base_dir: str = ""  # where the model's external data files are (weights are not loaded)
    file_nodes: int = 0  # nodes in the user's file, before --input-shapes folded any constants
    samples: list[Feeds] = field(default_factory=list)  # every sample, when --inputs holds several
    reference_seconds: float = 0.0  # the reference's runs that checked a fold (engine time)
    # the folded model's check run with every node output marked, for shrink's capture to take
    # (engine/activations.CheckCapture; None when not asked, not folded or too large)
    check_capture: object = None
    sample_verdicts: list = field(default_factory=list)  # SampleVerdict per sample


@dataclass
class RunOptions:
    """Options shared by check, shrink, pack and audit."""

    reference: str = "ort"
    metric: str = "rel-l2"
    tolerance: float | None = None
    atol: float | None = None
    rtol: float | None = None
    timeout: float = 600.0
    fail_regex: str | tuple | None = None  # one regex or several (any match fails)
    fail_codes: tuple = ()
    ignore_fail_codes: tuple = ()
    inputs: str | None = None
    sample: int | None = None  # None: every sample of a multi-sample --inputs (check, shrink)
    seed: int = 0
    input_shapes: dict = field(default_factory=dict)
    val_ranges: dict = field(default_factory=dict)
    # --reference-model: the user's fp32 model, the reference; MODEL is then its converted twin,
    # which the target runs (reprokit.engine.twinrun)
    reference_model: str | None = None
    quant_reference: str = "fake-quant"  # quantized models: fake-quant (the engine's error) or fp32 (engine/quantized.py)
    ignore_positions: str | None = None  # .npz of boolean masks per graph output: True = left out of the comparison
    # a quantized model's recorded judgement (QuantPolicy.recorded: an archive's verdict.json, or
    # the shrink's for its minimal model): its outputs judged in these steps, not the model's own
    quant_steps: dict | None = None

    def policy(self) -> CheckPolicy:
        """When a cmd target's run counts as a failure (polygraphy's --check rules)."""
        regexes = (self.fail_regex,) if isinstance(self.fail_regex, str) else tuple(self.fail_regex or ())
        return CheckPolicy(regexes, tuple(self.fail_codes), tuple(self.ignore_fail_codes))


def prepare(model_path: str, options: RunOptions, workdir: str, *, every_sample: bool = False,
            fold: bool = False, capture_within: int | None = None) -> Prepared:
    """Load and validate the model, freeze shapes if asked, make or load the feeds.
    ``every_sample``: a multi-sample --inputs without --sample gives ``samples`` (feeds: the
    first), for callers that judge each one (reprokit/samples.py). ``fold``: fold constants even
    without --input-shapes (shrink's default), checked on the reference like a frozen model's.
    ``capture_within``: a folded model's check run marks every node output when they fit this
    many bytes, and is kept as ``check_capture`` (shrink's capture, one reference run fewer)."""
    dims.forget()  # the sizes chosen for this model, named by any error that follows
    model = load_model(model_path, load_weights=False)
    check_valid(model, model_path)  # an invalid model is the user's file's fault, said before any engine runs
    file_nodes = len(model.graph.node)
    notes: list[str] = []
    path = model_path
    base_dir = os.path.dirname(os.path.abspath(model_path))
    if options.input_shapes:
        dims.given(options.input_shapes, dims.metadata_hints(model))
        model = freeze_input_shapes(model, options.input_shapes)
        path = save_model(model, os.path.join(workdir, "prepared.onnx"))
    infos = input_infos(model)
    samples: list[Feeds] = []
    if options.inputs and every_sample and options.sample is None:
        samples = load_samples(options.inputs, infos)
        feeds = samples[0]
        samples = samples if len(samples) > 1 else []
    elif options.inputs:
        feeds = load_feeds(options.inputs, infos, sample=options.sample)
    else:
        feeds = random_feeds(infos, seed=options.seed, shapes=options.input_shapes,
                             val_ranges=options.val_ranges, hints=dims.metadata_hints(model))
    spent: list[float] = []
    kept = None
    if options.input_shapes or fold:  # folded only where the folded model computes the same (one check)
        model, path, kept = fold_prepared(model, path, feeds.arrays, options, workdir, base_dir, notes, spent,
                                          capture_within)
    notes.extend(feeds.notes)
    return Prepared(model, path, infos, feeds, notes, base_dir, file_nodes, samples, reference_seconds=sum(spent),
                    check_capture=kept)


def load_ignored(path: str) -> dict[str, np.ndarray]:
    """--ignore-positions: an .npz of boolean arrays named as outputs, True where a position is
    left out of the comparison (padded positions nobody reads); read without pickles."""
    if not os.path.isfile(path):  # missing, a folder, or a FIFO a read would wait on for ever
        raise InputError(f"--ignore-positions {path} is not a file", hint="give the .npz of boolean arrays")
    try:
        with np.load(path, allow_pickle=False) as data:
            masks = {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"--ignore-positions {path}: cannot read it as an .npz ({exc})",
                         hint="np.savez('pad.npz', y=(attention_mask == 0)[..., None]): one boolean array per "
                              "output, True where that output is not compared") from exc
    wrong = [name for name, mask in masks.items() if mask.dtype != np.bool_]
    if wrong or not masks:
        raise InputError(f"--ignore-positions {path}: " + (f"{wrong[0]!r} is {masks[wrong[0]].dtype}, not bool"
                                                           if wrong else "it holds no array"),
                         hint="one boolean array per output name, True where that output is not compared")
    return masks


def admit_target(model_path: str, target: str) -> None:
    """The target's engine refuses, before any run, what it cannot run as asked on the user's
    model (``trt:int8`` without Q/DQ on a strongly typed TensorRT: issue 36)."""
    spec = parse_target(target)
    backend = backend_class(spec.engine)
    if backend.admit.__func__ is not Backend.admit.__func__:  # reads the file only where it matters
        backend.admit(spec, load_model(os.fspath(model_path), load_weights=False))


def make_oracle(target: str, options: RunOptions, workdir: str, *, target_env=None,
                target_model: str | None = None) -> Oracle:
    """Parse both specs (usage errors surface here, before any work) and build the oracle.
    ``target_model``: with --reference-model, the converted model the target runs."""
    target_spec = parse_target(target)
    reference_spec = parse_target(options.reference)
    if reference_spec.engine == "cmd":
        raise UsageError("the reference cannot be a cmd engine", hint="use --reference ort (the default)")
    policy = options.policy()
    if policy and target_spec.engine != "cmd":
        flag = "--fail-regex" if policy.regexes else "--fail-code/--ignore-fail-code"
        raise UsageError(f"{flag} applies only to a cmd target", hint="use --target 'cmd:...'")
    for regex in policy.regexes:
        try:
            re.compile(regex)
        except re.error as exc:
            raise UsageError(f"--fail-regex {regex!r} is not a regular expression: {exc}",
                             hint="Python re syntax, e.g. --fail-regex 'Error Code \\d+'") from exc
    backend = backend_class(target_spec.engine)(target_spec)
    precision = backend.precision()
    if options.reference_model and target_model:
        twinrun.check_target(target_spec)
        precision = twinrun.target_precision(target_model)
    criterion = Criterion.for_precision(precision, options.metric, options.tolerance,
                                        options.atol, options.rtol)
    oracle = Oracle(str(reference_spec), str(target_spec), criterion, precision=precision,
                    timeout=options.timeout, policy=policy, workdir=workdir,
                    target_env=target_env)
    oracle.ignore = load_ignored(options.ignore_positions) if options.ignore_positions else {}
    return oracle


@dataclass(frozen=True)
class SampleVerdict:
    """One sample's verdict on one model."""

    index: int
    verdict: Verdict

    def worst(self) -> dict | None:
        """The worst output's error; inf and nan as strings ("inf"), as every reprokit JSON has them."""
        worst = self.verdict.worst()
        if worst is None:
            return None
        error = worst.error if np.isfinite(worst.error) else str(worst.error)
        return {"output": worst.name, "metric": self.verdict.criterion.metric.value, "error": error}

    def to_json(self) -> dict:
        return {"index": self.index, "diverges": self.verdict.diverges,
                "signature": self.verdict.signature.to_json(), "worst": self.worst(),
                "verdict": self.verdict.to_json()}

    def line(self) -> str:
        """``sample 1: nonfinite (inf) in y; worst y rel-l2 inf`` — for people."""
        verdict = self.verdict
        text = f"sample {self.index}: " + (verdict.signature.describe() if verdict.diverges else "agrees")
        worst = self.worst()
        if worst is not None:
            error = worst["error"]
            text += f"; worst {worst['output']} {worst['metric']} {error if isinstance(error, str) else f'{error:.3g}'}"
        return text


@dataclass
class CheckResult:
    verdict: Verdict
    prepared: Prepared
    reference_outputs: dict
    target_outputs: dict
    layerwise: object | None = None  # reprokit.engine.layerwise.LayerwiseReport
    marking_changes_engine: bool = False
    target_log: str = ""  # the engine's own messages (worker output tail)
    samples: list = field(default_factory=list)  # SampleVerdict per sample of a multi-sample --inputs
    quantized: object | None = None  # engine/quantized.Attribution: the engine's or the quantization's
    quant: object | None = None  # engine/quantized.QuantPolicy the outputs were judged with, else None
    engine_seconds: float = 0.0  # the worker processes' seconds of its engine runs, reference's included


def _refuse_empty_comparison(verdict: Verdict, target: str) -> None:
    """"Agree" over zero numbers is no answer: an error, never a pass. (A cmd check that writes
    no outputs is a pass/fail check: its exit status is the comparison.)"""
    compared = [e for e in verdict.outputs if all(int(d) > 0 for d in e.shape)]
    if verdict.diverges or compared or (parse_target(target).engine == "cmd" and not verdict.outputs):
        return
    if verdict.outputs:
        shapes = ", ".join(f"{e.name}{list(e.shape)}" for e in verdict.outputs[:4])
        raise InputError(f"nothing was compared: every output is empty ({shapes})",
                         hint="a 0 in --input-shapes (or in the inputs) gives empty tensors; give every dim >= 1")
    raise InputError(f"nothing was compared: the target {target} returned no outputs",
                     hint="check that the target runs the model's outputs (reprokit --debug check ...)")


def check(model, target: str = "emulate:fp16", *, options: RunOptions | None = None,
          layerwise: bool = False, workdir: str | None = None) -> CheckResult:
    """Judge ``target`` against the reference on one model; optionally layer by layer."""
    options = options or RunOptions()
    own_tmp = None
    if workdir is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="reprokit-check-")
        workdir = own_tmp.name
    float_model = None
    if options.reference_model and floatref.is_quantized_file(os.fspath(model)):
        # a quantized MODEL: --reference-model is the float model it was quantized from, the
        # quantization's reference in place of the derived twin (engine/floatref.py)
        float_model, options = options.reference_model, dataclasses.replace(options, reference_model=None)
        if options.tolerance is not None or options.atol is not None or options.rtol is not None:
            raise UsageError(f"--reference-model {float_model} on a quantized model with a tolerance of your own: "
                             "the model is then judged as any model, and nothing compares it with your float model",
                             hint="drop --tol/--atol/--rtol to compare with your float model (docs/quantized.md)")
    converted = os.fspath(model) if options.reference_model else None
    model = options.reference_model or model  # --reference-model: the reference's model is the one judged
    oracle = make_oracle(target, options, os.path.join(workdir, "calls"), target_model=converted)
    check_target_nodes(os.fspath(model), target)
    admit_target(os.fspath(model), target)
    prepared = prepare(os.fspath(model), options, workdir, every_sample=True)
    oracle.weights_dir = prepared.base_dir
    if converted:
        prepared.notes.append(twinrun.attach(oracle, prepared.model, prepared.path, converted))
    policy = quantized.judge_with(oracle, prepared.model, options)
    user = floatref.match(prepared.model, float_model) if float_model else None  # matched before any run
    if user is not None and user.note:
        prepared.notes.append(f"{user.label}: {user.note}")
    if options.quant_steps is not None:  # judged as the run that recorded it judged (verify, pack after shrink)
        policy = oracle.quant = quantized.QuantPolicy.from_recorded(options.quant_steps)
    runs = []
    for feeds in prepared.samples or [prepared.feeds]:  # a multi-sample --inputs: each sample judged
        reference = oracle.run_reference(prepared.path, feeds.arrays)
        check_reference_finite(reference.outputs, oracle.reference)
        result = oracle.run_target(prepared.path, feeds.arrays)
        verdict = oracle.verdict_from(result, reference.outputs)
        _refuse_empty_comparison(verdict, target)
        runs.append((feeds, reference, result, verdict))
    shown = next((k for k, run in enumerate(runs) if run[3].diverges), 0)  # the numbers shown
    for k, run in enumerate(runs):
        if k != shown:
            run[1].discard()
            run[2].discard()
    feeds, reference, result, verdict = runs[shown]
    attribution = None
    if policy is not None:  # whose divergence: the engine's or the quantization's (docs/quantized.md)
        against = "the fp32 twin"
        if user is not None:
            twin, why, against = user.run(oracle, feeds.arrays), "", user.label
        else:
            twin, why = quantized.run_twin(oracle, prepared.model, feeds.arrays, workdir)
        if twin is not None and options.quant_reference == quantized.QuantReference.FP32.value:
            verdict = quantized.against_twin(oracle, result, twin)
        attribution = quantized.attribute(runs[shown][3], reference.outputs, twin, twin_note=why,
                                          model=prepared.model, against=against)

    samples = []
    if prepared.samples:
        samples = [SampleVerdict(k, run[3]) for k, run in enumerate(runs)]
        prepared.feeds, prepared.sample_verdicts = feeds, samples
        prepared.notes.append(f"{options.inputs} has {len(runs)} samples: each is judged (--sample N picks one); "
                              f"the numbers below are sample {shown}'s")
    marking = marking_changes_engine(target)
    report = None
    if layerwise:
        report = run_layerwise(oracle, prepared, os.path.join(workdir, "layerwise"))
    out = CheckResult(verdict, prepared, reference.outputs, result.outputs, report, marking,
                      target_log=f"{result.message}\n{result.log}".strip(), samples=samples,
                      quantized=attribution, quant=policy,
                      engine_seconds=oracle.stats.target_seconds + oracle.stats.reference_seconds)
    out._tmp = own_tmp  # keep memory-mapped outputs alive as long as the result
    return out
