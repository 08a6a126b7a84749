"""Calibration diagnosis of a quantized (Q/DQ) model on real inputs: which QuantizeLinear nodes
clip (share of values outside the range their scale and zero point represent, ranked), which of
them cause the output's divergence from the fp32 twin (causal: the clipped value replaced by the
unclipped one — the Q/DQ pair left out — in the reference run of the fake-quant model), and the
fix in the user's terms, tested: the nodes to leave unquantized (``nodes_to_exclude`` of
onnxruntime's ``quantize_static``) or the calibration range to widen.

Every number comes from reference runs (fake-quant on onnxruntime, optimizations off): no target
call. Must not change verdicts or write files; audit/__init__.py puts the result in audit.json.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx

from reprokit.graph import qtypes, quant
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import save_model
from reprokit.graph.model import mark_outputs
from reprokit.standalone.compare import DEFAULT_TOLERANCE

CAUSAL_LIMIT = 8  # clipping nodes tried one by one, most clipped first (one reference run each)


@dataclass(frozen=True)
class Suspect:
    """One clipping QuantizeLinear and what leaving its Q/DQ pair out does to the output."""

    clip: quant.Clipping
    error_without: float | None  # rel-l2 of fake-quant vs the fp32 twin with this pair left out

    def to_json(self) -> dict:
        c = self.clip
        return {
            "node": c.node,
            "tensor": c.tensor,
            "clipped": c.clipped,
            "range": [c.lo, c.hi],
            "seen": [c.seen_min, c.seen_max],
            "widen_by": c.widen_by,
            "readers": list(c.reader_ops),
            "producer": c.producer,
            "error_without": self.error_without,
        }


@dataclass(frozen=True)
class Diagnosis:
    error: float  # rel-l2 of fake-quant vs the fp32 twin (worst output)
    tolerance: float
    suspects: tuple[Suspect, ...]
    cause: tuple[
        str, ...
    ]  # the Q nodes whose pairs, left out together, bring the error within tolerance
    error_fixed: float | None  # the error with those left out (tested)
    exclude: tuple[
        str, ...
    ]  # nodes_to_exclude: the float nodes that read the cause's dequantized values
    widened_error: (
        float | None
    )  # the error with the cause's scales widened to what the inputs reach (tested)
    note: str = ""
    # the error with EVERY clipping pair's scale widened to what the inputs reach: a calibration
    # set that covers the inputs (tested; None where nothing clips or the error is within tolerance)
    all_widened_error: float | None = None
    against: str = (
        "the fp32 twin"  # what the error is measured against: the twin or your float model
    )
    fp8: bool = False  # every Q/DQ is FP8: the printed call quantizes to FP8 as the model was

    @property
    def printed_fix(self) -> str:
        if not self.cause:
            return ""
        if self.fp8:  # onnxruntime's FP8 calibration takes only the Distribution method
            return (
                "quantize_static(model_fp32, model_fp8, calibration_reader, quant_format=QuantFormat.QDQ, "
                "activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN, "
                f"calibrate_method=CalibrationMethod.Distribution, nodes_to_exclude={list(self.exclude)!r})"
            )
        return (
            f"quantize_static(model_fp32, model_int8, calibration_reader, quant_format=QuantFormat.QDQ, "
            f"nodes_to_exclude={list(self.exclude)!r})"
        )

    def to_json(self) -> dict:
        return {
            "error": self.error,
            "tolerance": self.tolerance,
            "cause": list(self.cause),
            "error_fixed": self.error_fixed,
            "fix_within_tolerance": self.error_fixed is not None
            and self.error_fixed <= self.tolerance,
            "nodes_to_exclude": list(self.exclude),
            "printed_fix": self.printed_fix,
            "widened_error": self.widened_error,
            "all_widened_error": self.all_widened_error,
            "note": self.note,
            "against": self.against,
            "clipping": [s.to_json() for s in self.suspects],
        }


def _rel_l2(a: dict, b: dict) -> float:
    worst = 0.0
    for name, ref in b.items():
        if name in a:
            r = np.asarray(ref, np.float64)
            gap = np.linalg.norm(np.asarray(a[name], np.float64) - r) / max(
                np.linalg.norm(r), 1e-30
            )
            worst = max(worst, float(gap))
    return worst


def without_pairs(model, names: set[str]):
    """``model`` with the Q/DQ pairs of the QuantizeLinear nodes ``names`` left out (a pair that
    took a Relu/Clip's place becomes that clamp again): what nodes_to_exclude makes."""
    return quant.fp32_twin(model, only=set(names))


def widened(model, clips: list[quant.Clipping]):
    """``model`` with each clip's scale multiplied by its ``widen_by`` (a wider calibration range)."""
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    by_name = {n.name: n for n in model.graph.node}
    inits = {t.name: t for t in model.graph.initializer}
    for clip in clips:
        node = by_name.get(clip.node)
        if node is None or node.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]]) * np.float32(clip.widen_by * 1.01)
        # the scale is shared with the pair's DequantizeLinear (same initializer): both move together
        inits[node.input[1]].CopyFrom(
            numpy_helper.from_array(scale.astype(np.float32), node.input[1])
        )
    return model


def diagnose(
    oracle,
    model,
    feeds: dict,
    work: str,
    event=lambda text: None,
    tolerance: float = DEFAULT_TOLERANCE["int8"],
    float_model=None,
) -> Diagnosis | None:
    """The calibration diagnosis of ``model`` on ``feeds`` (None: it holds no QuantizeLinear).
    ``float_model``: the user's float model (engine/floatref.FloatReference), measured against in
    place of the fp32 twin."""
    if not any(n.op_type == quant.Q for n in model.graph.node):
        return None
    os.makedirs(work, exist_ok=True)
    index = GraphIndex.build(model)

    def reference(candidate, name: str, extra: list[str] = ()) -> dict:
        marked = mark_outputs(candidate, list(extra)) if extra else candidate
        path = save_model(marked, os.path.join(work, f"{name}.onnx"))
        result = oracle.run_reference(path, feeds)
        outputs = {k: np.array(v) for k, v in result.outputs.items()}
        result.discard()
        return outputs

    outputs = [o.name for o in model.graph.output]
    against = float_model.label if float_model is not None else "the fp32 twin"
    fp8 = qtypes.qdq_types(model) <= set(qtypes.FLOAT8)
    if float_model is not None:
        event(f"calibration: {against} and every QuantizeLinear's input (reference runs)")
        truth = {k: v for k, v in float_model.run(oracle, feeds).items() if k in outputs}
    else:
        try:
            twin = quant.fp32_twin(model)
        except ValueError as exc:
            return Diagnosis(0.0, tolerance, (), (), None, (), None, note=str(exc))
        event("calibration: the fp32 twin and every QuantizeLinear's input (reference runs)")
        truth = {k: v for k, v in reference(twin, "twin").items() if k in outputs}
    q_inputs = sorted({n.input[0] for n in model.graph.node if n.op_type == quant.Q} - set(outputs))
    captured = reference(model, "quantized", q_inputs)
    values = dict(captured) | dict(feeds)
    base = _rel_l2({k: captured[k] for k in outputs}, truth)
    clips = quant.clipping(model, index, values)
    suspects = []
    for clip in clips[:CAUSAL_LIMIT]:
        event(f"calibration: {clip.node} left unquantized")
        fixed = reference(without_pairs(model, {clip.node}), "without")
        suspects.append(Suspect(clip, _rel_l2(fixed, truth)))
    suspects += [Suspect(c, None) for c in clips[CAUSAL_LIMIT:]]
    cause: list[str] = []
    error_fixed = None
    if base > tolerance and suspects:
        # the causal test: the fewest pairs, most helpful first, whose removal brings the output back
        ranked = sorted(
            (s for s in suspects if s.error_without is not None), key=lambda s: s.error_without
        )
        for suspect in ranked:
            if suspect.error_without >= base:
                break  # leaving it out does not help: not a cause
            cause.append(suspect.clip.node)
            error_fixed = _rel_l2(reference(without_pairs(model, set(cause)), "fixed"), truth)
            if error_fixed <= tolerance:
                break
    chosen = [s.clip for s in suspects if s.clip.node in cause]
    # the node that makes each clipped tensor and the nodes that read it: quantize_static puts a
    # pair on a tensor when either side is quantized (MobileNetV2: its readers alone left every
    # pair in place, 0.35 -> 0.35; with the producers 0.35 -> 0.179, docs/quantized.md)
    exclude = tuple(
        dict.fromkeys(
            n for c in chosen for n in ((c.producer,) if c.producer else ()) + c.reader_ops
        )
    )
    widened_error = None
    if chosen:
        widened_error = _rel_l2(reference(widened(model, chosen), "widened"), truth)
    all_widened = None
    if base > tolerance and clips:
        event(f"calibration: every clipping pair widened ({len(clips)})")
        all_widened = _rel_l2(reference(widened(model, clips), "all-widened"), truth)
    note = (
        ""
        if base > tolerance
        else f"fake-quant is within {tolerance:g} of {against}: calibration holds"
    )
    return Diagnosis(
        base,
        tolerance,
        tuple(suspects),
        tuple(cause),
        error_fixed,
        exclude,
        widened_error,
        note,
        all_widened,
        against,
        fp8,
    )
