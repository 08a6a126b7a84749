"""Knob sweep and explain: rerun the divergence under the settings users try by hand (suspected
nodes kept in fp32, LayerNorm fused, static/dynamic batch, bf16 instead of fp16, TF32 off, fp32)
and under random inputs / random weights, one target call per setting.

Each setting is judged like ``reprokit check --target SETTING`` would judge it (its own default
tolerance unless the user set one), against the reference outputs captured once.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from reprokit.engine.bug import shows_bug
from reprokit.engine.oracle import check_reference_finite
from reprokit.engine.session import make_oracle
from reprokit.errors import EngineUnavailable, ReferenceFailure, ReprokitError
from reprokit.graph.io import save_model
from reprokit.report.redact import _SMALL, _like
from reprokit.shrink.fp32_nodes import fp32_nodes_support
from reprokit.spec import TargetSpec, parse_target
from reprokit.standalone.compare import compare_arrays

NOT_APPLICABLE = "not applicable"
CPU_BATCH = "CPU target: no per-batch engine profile to change (TensorRT only)"
_NARROW = ("fp16", "bf16")


@dataclass
class Setting:
    key: str  # fp32-nodes, layernorm, batch, narrow, no-tf32, fp32, fp32-full
    change: str  # in words
    rank: int  # how small a change: smaller first
    target: str | None  # spec; None when not applicable
    model: str = "original"  # original, layernorm, static-batch, dynamic-batch
    reason: str = ""  # why not applicable


@dataclass
class SweepRow:
    key: str
    change: str
    rank: int
    setting: str
    verdict: str  # agree, nonfinite, mismatch, build-error, …, not applicable, unavailable, failed
    error: float | str | None = None
    tolerance: float | None = None
    fixes: bool = False  # agrees under the setting's own criterion, as `reprokit check` judges it
    within_original: bool | None = None  # error within the tolerance that flagged the divergence
    target_calls: int = 0
    reference_calls: int = 0
    seconds: float = 0.0
    note: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        if isinstance(self.error, float) and not np.isfinite(self.error):
            out["error"] = str(self.error)
        out["seconds"] = round(self.seconds, 3)
        return out


def _spec(spec: TargetSpec, drop=(), add=()) -> str:
    parts = [k if v is True else f"{k}={v}" for k, v in spec.options if k not in drop] + list(add)
    return spec.engine + (":" + ",".join(parts) if parts else "")


def _nodes_option(nodes: list[str]) -> str:
    return "fp32-nodes=" + ";".join(nodes)


def plan(target: str, candidates: list[list[str]], layernorm: tuple[bool, str], batch: tuple[str, str] | None) -> list[Setting]:
    """The settings to try for ``target``, smallest change first.

    ``candidates``: node sets to keep in fp32; ``layernorm``: (rewrite available, words);
    ``batch``: (model variant, words) or None when the model has no batch dim.
    """
    spec = parse_target(target)
    settings: list[Setting] = []
    narrow = next((p for p in _NARROW if spec.has(p)), None)
    engine = spec.engine
    # ort:cuda converts the model as strongly typed TensorRT does, and has TF32: the GPU settings
    gpu = engine == "trt" or (engine == "ort" and spec.has("cuda"))
    if engine == "cmd":
        return [Setting("all", "every setting", 0, None, reason="a cmd target has no settings reprokit can vary")]
    # 1. suspected nodes in fp32
    per_node, why = fp32_nodes_support(target)
    if per_node:
        usable = [c for c in candidates if c and not any(("," in n or ";" in n) for n in c)]
        for nodes in usable:
            settings.append(Setting("fp32-nodes", f"keep {len(nodes)} node{'s' if len(nodes) > 1 else ''} in fp32: "
                                    + ", ".join(nodes), 1, _spec(spec, drop=("fp32-nodes",), add=(_nodes_option(nodes),))))
        if not usable:
            settings.append(Setting("fp32-nodes", "keep the suspected nodes in fp32", 1, None,
                                    reason="no suspected node (no range finding, no layerwise divergence)"))
    else:
        settings.append(Setting("fp32-nodes", "keep the suspected nodes in fp32", 1, None, reason=why))
    # 2. LayerNorm as one node
    available, words = layernorm
    settings.append(Setting("layernorm", "LayerNorm as one LayerNormalization node (opset 17)", 2,
                            target if available else None, model="layernorm", reason=words))
    # 3. static versus dynamic batch
    if engine != "trt":
        reason = CPU_BATCH if not gpu else "onnxruntime's CUDA provider has no per-batch engine profile (TensorRT only)"
        settings.append(Setting("batch", "static versus dynamic batch profile", 3, None, reason=reason))
    elif batch is None:
        settings.append(Setting("batch", "static versus dynamic batch profile", 3, None, reason="the model has no batch dim"))
    else:
        settings.append(Setting("batch", batch[1], 3, target, model=batch[0]))
    # 4. the other narrow type
    other = {"fp16": "bf16", "bf16": "fp16"}.get(narrow or "")
    if engine == "openvino":
        hint = next((h for h in ("bf16", "f16", "f32") if spec.has(h)), "bf16")
        swap = {"bf16": "f16", "f16": "bf16"}.get(hint)
        settings.append(Setting("narrow", f"{swap} instead of {hint}", 4, f"openvino:{swap}") if swap else
                        Setting("narrow", "another narrow type", 4, None, reason="the target computes in f32"))
    elif other:
        settings.append(Setting("narrow", f"{other} instead of {narrow}", 4,
                                _spec(spec, drop=(narrow, "fp32-nodes"), add=(other,))))
    else:
        settings.append(Setting("narrow", "bf16 instead of fp16", 4, None, reason=f"{spec} uses neither fp16 nor bf16"))
    # 5. TF32 off, 6./7. fp32
    if gpu:
        if spec.has("no-tf32"):
            settings.append(Setting("no-tf32", "TF32 off", 5, None, reason="TF32 is already off"))
        elif narrow or spec.has("int8") or spec.has("fp8"):
            settings.append(Setting("no-tf32", "TF32 off (narrow type kept)", 5, _spec(spec, add=("no-tf32",))))
        fp32 = _spec(spec, drop=("fp16", "bf16", "int8", "fp8", "fp32-nodes", "strongly-typed", "no-tf32"))
        if narrow or spec.has("int8") or spec.has("fp8"):
            settings.append(Setting("fp32", "fp32 with TF32 on (no narrow type)", 6, fp32))
        settings.append(Setting("fp32-full", "full fp32 (no narrow type, TF32 off)", 7, _spec(parse_target(fp32), add=("no-tf32",))))
    else:
        why = "the emulator has no TF32 (it rounds storage only)" if engine == "emulate" else f"{engine} on the CPU has no TF32"
        settings.append(Setting("no-tf32", "TF32 off", 5, None, reason=why))
        fp32 = {"emulate": "ort", "openvino": "openvino:f32", "ort": "ort"}[engine]
        words = {"emulate": "fp32: plain onnxruntime, no rounding", "openvino": "f32 inference precision",
                 "ort": "plain onnxruntime CPU fp32"}[engine]
        if fp32 != target:
            settings.append(Setting("fp32", words, 6, fp32))
    return settings


@dataclass
class Bench:
    """What every setting runs against: the audited model file, feeds, captured reference."""

    model: object
    path: str
    feeds: dict
    reference: dict  # graph outputs of the reference capture
    options: object  # RunOptions
    workdir: str
    ledger: object  # calls.Ledger
    base_dir: str = ""  # where the model's external weights are (engines are told)
    variants: dict = field(default_factory=dict)  # variant name -> model path


def run_setting(bench: Bench, setting: Setting, signature, original) -> SweepRow:
    """Run one setting (one target call; two for a rewritten model, whose reference is rerun).
    ``original`` is the Criterion that flagged the divergence."""
    row = SweepRow(setting.key, setting.change, setting.rank, setting.target or "-", NOT_APPLICABLE,
                   note=setting.reason)
    if setting.target is None:
        return row
    row.note = ""
    path = bench.variants.get(setting.model, bench.path) if setting.model != "original" else bench.path
    if setting.model != "original" and setting.model not in bench.variants:
        row.note = f"the {setting.model} model could not be made"
        return row
    before = len(bench.ledger.calls)
    try:
        oracle = make_oracle(setting.target, bench.options, os.path.join(bench.workdir, "sweep"))
        oracle.weights_dir = bench.base_dir or None
        reference = bench.reference
        if setting.model == "layernorm":
            ref = bench.ledger.run("sweep", "reference", oracle, f"reference of the {setting.model} model",
                                   path, bench.feeds)
            reference = {k: np.asarray(v) for k, v in ref.outputs.items()}
            worst = max((compare_arrays(k, bench.reference[k], v, oracle.criterion).rel_l2
                         for k, v in reference.items() if k in bench.reference), default=0.0)
            row.note = (f"{setting.reason}; the rewritten model equals the original on the reference "
                        f"(rel L2 {worst:.2g})")
        result = bench.ledger.run("sweep", "target", oracle, setting.change, path, bench.feeds)
        verdict = oracle.verdict_from(result, reference)
    except EngineUnavailable as exc:
        row.verdict, row.note = "unavailable", exc.message.splitlines()[0][:200]
    except ReprokitError as exc:
        row.verdict, row.note = "failed", exc.message.splitlines()[0][:200]
    else:
        row.verdict = verdict.kind.value
        worst = verdict.worst()
        row.error = float(worst.error) if worst is not None else None
        row.tolerance = verdict.criterion.tolerance
        row.fixes = not verdict.diverges
        if original.metric.value != "allclose" and worst is not None and verdict.kind.value in ("agree", "mismatch"):
            row.within_original = bool(worst.error <= original.tolerance)
        if verdict.diverges and not shows_bug(signature, verdict):
            row.note = (row.note + "; " if row.note else "") + f"a different failure: {verdict.signature.describe()}"
        if verdict.message and not row.note:
            row.note = verdict.message.splitlines()[0][:200]
    calls = bench.ledger.calls[before:]
    row.target_calls = sum(c.role == "target" for c in calls)
    row.reference_calls = sum(c.role == "reference" for c in calls)
    row.seconds = sum(c.seconds for c in calls)
    return row


def workaround(rows: list[SweepRow]) -> tuple[SweepRow | None, str]:
    """The smallest change that makes the divergence go away, and on what basis: the setting
    agrees under its own criterion, or (failing that) its error is within the tolerance that
    flagged the divergence."""
    for basis, test in (("agrees under its own tolerance", lambda r: r.fixes),
                        ("not within its own tolerance, but within the one that flagged the divergence", lambda r: r.within_original)):
        found = sorted((r for r in rows if test(r)), key=lambda r: r.rank)
        if found:
            return found[0], basis
    return None, ""


# ---------------------------------------------------------------- explain


def random_like_feeds(feeds: dict, seed: int) -> dict:
    """Float feeds replaced by random values of the same shape, mean and std; others kept."""
    rng = np.random.default_rng(seed)
    return {k: (_like(np.asarray(v), rng) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
            for k, v in feeds.items()}


def random_weights_model(model, seed: int, base_dir: str = ""):
    """Float weights (more than 16 values) replaced by random values of the same shape, mean and
    std, as ``reprokit pack --redact`` does; BatchNormalization variances kept positive."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    rng = np.random.default_rng(seed)
    variances = {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) > 4}
    replaced = 0
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor, base_dir)
        if array.dtype.kind == "f" and array.size > _SMALL:
            new = _like(array, rng)
            if tensor.name in variances:
                new = np.abs(new)
            tensor.CopyFrom(numpy_helper.from_array(new.astype(array.dtype), tensor.name))
            replaced += 1
    return model, replaced


def explain(bench: Bench, oracle, signature, seed: int) -> dict:
    """Does it still diverge with random inputs? with random weights? What does that say?"""
    out = {}
    weights, replaced = random_weights_model(bench.model, seed, bench.base_dir)
    variants = {
        "random_inputs": (bench.path, random_like_feeds(bench.feeds, seed),
                          f"inputs replaced by random values of the same shape, mean and std (seed {seed})"),
        "random_weights": (save_model(weights, os.path.join(bench.workdir, "random_weights.onnx")), bench.feeds,
                           f"{replaced} weight tensors replaced by random values of the same shape, mean and std (seed {seed})"),
    }
    for key, (path, feeds, words) in variants.items():
        entry = {"what": words, "diverges": None, "verdict": None, "error": None, "same_bug": None}
        try:
            ref = bench.ledger.run("explain", "reference", oracle, key.replace("_", " "), path, feeds)
            check_reference_finite(ref.outputs, oracle.reference)
            result = bench.ledger.run("explain", "target", oracle, key.replace("_", " "), path, feeds)
            verdict = oracle.verdict_from(result, ref.outputs)
        except ReferenceFailure as exc:
            entry["verdict"] = "inconclusive"
            entry["note"] = exc.message
        else:
            worst = verdict.worst()
            entry.update(diverges=verdict.diverges, verdict=verdict.kind.value,
                         error=(float(worst.error) if worst and np.isfinite(worst.error) else (str(worst.error) if worst else None)),
                         same_bug=shows_bug(signature, verdict))
        out[key] = entry
    out["conclusion"] = conclude(out["random_inputs"].get("diverges"), out["random_weights"].get("diverges"))
    return out


def conclude(with_random_inputs: bool | None, with_random_weights: bool | None) -> str:
    if with_random_inputs is None or with_random_weights is None:
        return "inconclusive: the reference itself fails on one of the random variants"
    if with_random_inputs and with_random_weights:
        return ("engine: it diverges with random inputs and with random weights of the same statistics alike, "
                "so it follows from the graph and the scale of its values under this target, not from "
                "particular data or particular weight values")
    if with_random_inputs:
        return ("weights: it diverges with random inputs but not with random weights of the same statistics, "
                "so particular weight values (their structure, not their scale) trigger it")
    if with_random_weights:
        return ("data: it diverges with random weights but not with random inputs of the same statistics, "
                "so these particular inputs trigger it")
    return ("data and weights together: neither random inputs nor random weights reproduce it, "
            "only these inputs with these weights")
