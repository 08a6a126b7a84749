"""How a quantized model (Q/DQ or integer ops) is judged, and which reference says what.

Two references answer two questions (docs/quantized.md):

- ``fake-quant`` (the default): the quantized model itself on onnxruntime with optimizations off,
  which evaluates every QuantizeLinear/DequantizeLinear exactly as the ONNX spec says, in fp32.
  Against an engine that runs int8 kernels it isolates **the engine's** error. An output the model
  quantizes is judged in units of its quantization step: an engine-only difference below one
  step is int8 rounding ("agrees"); other tensors downstream of quantized ops are judged at the
  int8 tolerance instead of the fp32 one (a maintainer would close a 5e-3 int8 difference judged
  at 1e-4 as expected rounding).
- ``fp32``: the fp32 twin (graph/quant.py: the activation Q/DQ pairs dropped, the weights
  dequantized). Against the fake-quant run it measures **the quantization's** error (scales,
  calibration): a divergence there is no engine's bug.

Must not build candidates or print; the CLI and session read :class:`QuantPolicy` and
:class:`Attribution`.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from dataclasses import dataclass

from reprokit.errors import UsageError
from reprokit.graph import qtypes, quant
from reprokit.graph.index import GraphIndex
from reprokit.graph.io import save_model
from reprokit.standalone.compare import (
    DEFAULT_TOLERANCE,
    Criterion,
    Metric,
    OutputError,
    compare_arrays,
    judge_in_steps,
    step_at,
)

_MEMBER = re.compile(r"^rk\d+/")  # a packed member's tensors carry its prefix (graph/pack.py)


class QuantReference(str, enum.Enum):
    FAKE_QUANT = "fake-quant"
    FP32 = "fp32"


@dataclass(frozen=True)
class QuantPolicy:
    """Per-tensor judgement of a quantized model: tensors with a quantization step are judged by
    max-abs in steps (error = max-abs / step; more than one step diverges), other tensors
    downstream of quantized ops by rel-l2 at the int8 tolerance; the rest by the base criterion."""

    ops: tuple[tuple[str, int], ...]  # the quantization ops found, with counts
    steps: dict  # tensor -> step (the scale; an FP8 tensor's unit spacing)
    downstream: frozenset
    fallback: float = DEFAULT_TOLERANCE["int8"]
    # tensor -> FP8 format, for tensors on an FP8 grid: their step is the format's spacing at the
    # tensor's largest reference value (3 mantissa bits: a relative grid, not int8's uniform one)
    float8: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        ops = ", ".join(f"{count} {op}" for op, count in self.ops)
        fp8 = (
            " (FP8 tensors: the format's spacing at the tensor's largest value)"
            if self.float8
            else ""
        )
        return (
            f"the model holds quantized ops ({ops}): outputs the model quantizes are judged in "
            f"quantization steps{fp8} (more than 1 step diverges), others after quantized ops at "
            f"rel-l2 <= {self.fallback:g}"
        )

    def step_of(self, name: str, max_abs_reference: float) -> float | None:
        """The step ``name`` is judged in: its scale, or for an FP8 tensor the scale times the
        format's spacing at the reference's largest magnitude; None where it has none."""
        name = self._name(name)
        return step_at(self.steps.get(name), self.float8.get(name), max_abs_reference)

    def _name(self, name: str) -> str:
        return _MEMBER.sub("", name)

    def rejudge(self, errors: list[OutputError], base: Criterion) -> list[OutputError]:
        out = []
        for error in errors:
            name = self._name(error.name)
            out.append(judge_in_steps(error, self.step_of(name, error.max_abs_reference), name in self.downstream, self.fallback, base))
        return out

    def recorded(self, outputs) -> dict:
        """The judgement of ``outputs`` (a model's graph outputs) as plain data, what an archive's
        verdict.json records (``quant_steps``) so that repro.py and verify judge as this run did."""
        names = [self._name(n) for n in outputs]
        return {
            "steps": {n: float(self.steps[n]) for n in names if self.steps.get(n)},
            "after_quantized": [n for n in names if not self.steps.get(n) and n in self.downstream],
            "fallback": float(self.fallback),
            "ops": dict(self.ops),
            "float8": {n: self.float8[n] for n in names if n in self.float8},
        }

    @classmethod
    def from_recorded(cls, table: dict) -> QuantPolicy:
        """The policy ``recorded`` wrote (a checked verdict.json's ``quant_steps``)."""
        return cls(
            tuple(sorted((str(op), int(n)) for op, n in table.get("ops", {}).items())),
            {str(n): float(step) for n, step in table["steps"].items()},
            frozenset(str(n) for n in table.get("after_quantized", ())),
            float(table.get("fallback", DEFAULT_TOLERANCE["int8"])),
            {str(n): str(kind) for n, kind in table.get("float8", {}).items()},
        )

    def unit(self, name: str) -> str:
        """How the error of ``name`` reads: ``steps`` or the criterion's metric."""
        return "steps" if self.steps.get(self._name(name)) else ""


def policy_for(model, index, *, tolerance_given: bool) -> QuantPolicy | None:
    """The judgement of a quantized ``model`` (None: it holds no quantized op, or the user gave a
    tolerance of their own, which then holds everywhere)."""
    ops = quant.holds_quantized(model)
    if not ops or tolerance_given:
        return None
    grids = quant.tensor_grids(model, index)
    return QuantPolicy(
        tuple(sorted(ops.items())),
        {tensor: step for tensor, (step, _) in grids.items()},
        quant.downstream(model, index),
        float8={tensor: kind for tensor, (_, kind) in grids.items() if kind in qtypes.FLOAT8},
    )


@dataclass(frozen=True)
class Attribution:
    """Whose divergence it is: the engine's (target vs fake-quant) or the quantization's
    (fake-quant vs the fp32 twin), each output's numbers."""

    engine: dict  # output -> error in steps (or rel-l2 where no step), from the target's verdict
    engine_exceeds: bool
    quantization: dict  # output -> rel-l2 of fake-quant against the fp32 twin
    quantization_exceeds: bool
    tolerance: float  # the rel-l2 the quantization error is judged at
    twin_note: str = ""  # why no twin ran, where none did
    kernels: str = (
        ""  # what the target says of its integer kernels (OpenVINO: how many ops ran in i8/u8)
    )
    failure: str = ""  # the target's verdict kind when it failed to build or run: no number to attribute
    limits: str = ""  # what of the model TensorRT's parser documents it does not take (tensorrt_limits)
    against: str = "the fp32 twin"  # the quantization's reference: the derived twin, or your float model

    @property
    def cause(self) -> str:
        if self.failure:
            return "engine-failed"
        if self.twin_note:  # no twin: only the engine's side was measured
            return "engine" if self.engine_exceeds else "engine-agrees"
        if self.engine_exceeds and self.quantization_exceeds:
            return "both"
        if self.engine_exceeds:
            return "engine"
        if self.quantization_exceeds:
            return "quantization"
        return "none"

    def sentence(self) -> str:
        words = {
            "engine": "the engine's: it differs from the Q/DQ semantics (fake-quant) by more than a "
            f"quantization step; the quantization itself stays close to {self.against}",
            "quantization": "the quantization's (scales, calibration): the fake-quant model already "
            f"differs from {self.against}; the engine agrees with fake-quant within a step",
            "both": "both: the engine differs from fake-quant by more than a step, and fake-quant "
            f"differs from {self.against}",
            "none": f"neither: the engine agrees with fake-quant within a step, fake-quant with {self.against}",
            "engine-agrees": "not the engine's: it agrees with the Q/DQ semantics (fake-quant) within a step; "
            "the quantization's own error was not measured",
            "engine-failed": f"the engine's: it did not run the quantized model ({self.failure}), so no "
            "number compares it with fake-quant",
        }
        text = words[self.cause]
        if self.limits:
            text += f"; {self.limits}"
        if self.cause == "engine" and self.twin_note:
            text = (
                "the engine's: it differs from the Q/DQ semantics (fake-quant) by more than a quantization "
                "step; the quantization's own error was not measured"
            )
        if self.twin_note:
            text += f" ({self.twin_note})"
        if self.kernels:
            text += f"; {self.kernels}"
        return text

    def to_json(self) -> dict:
        return {
            "cause": self.cause,
            "engine": self.engine,
            "engine_exceeds": self.engine_exceeds,
            "quantization_rel_l2": self.quantization,
            "quantization_exceeds": self.quantization_exceeds,
            "quantization_tolerance": self.tolerance,
            "twin_note": self.twin_note,
            "kernels": self.kernels,
            "failure": self.failure,
            "tensorrt_limits": self.limits,
            "quantization_reference": self.against,
        }


def attribute(
    verdict,
    fake_quant: dict,
    twin_outputs: dict | None,
    *,
    twin_note: str = "",
    tolerance: float = DEFAULT_TOLERANCE["int8"],
    model=None,
    against: str = "the fp32 twin",
) -> Attribution:
    """Whose divergence: the target's verdict against fake-quant (already judged in steps), and
    the fp32 twin's outputs against fake-quant (rel-l2 at ``tolerance``). A target that failed
    (build error, crash, timeout) is the engine's with no number; on ``trt`` targets the words
    name what of ``model`` TensorRT's parser does not take (``tensorrt_limits``)."""
    engine = {e.name: float(e.error) for e in verdict.outputs}
    engine_exceeds = verdict.diverges
    quantization: dict = {}
    if twin_outputs is not None:
        criterion = Criterion(Metric.REL_L2, tolerance)
        for name, ref in fake_quant.items():
            if name in twin_outputs:
                quantization[name] = float(
                    compare_arrays(name, twin_outputs[name], ref, criterion).rel_l2
                )
    exceeds = any(value > tolerance for value in quantization.values())
    return Attribution(
        engine,
        engine_exceeds,
        quantization,
        exceeds,
        tolerance,
        twin_note,
        _kernels(verdict.target, verdict.target_meta, _low_precision(model)),
        verdict.kind.value if verdict.diverges and verdict.kind.value not in ("mismatch", "nonfinite") else "",
        tensorrt_limits(model) if model is not None and verdict.target.startswith("trt") else "",
        against,
    )


def tensorrt_limits(model) -> str:
    """What of a Q/DQ model TensorRT's ONNX parser refuses, in the user's terms, or "": an int32
    DequantizeLinear input (a bias quantize_static quantized) and a non-zero zero point
    (asymmetric uint8). Measured on the TensorRT-RTX 1.7 builder (docs/quantized.md, "TensorRT"):
    both are parse errors, and the same calibration quantized symmetric int8 with float biases
    builds."""
    from onnx import TensorProto, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    int32 = [n.name or n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"
             and n.input[0] in inits and inits[n.input[0]].data_type == TensorProto.INT32]
    shifted = [n.name or n.output[0] for n in model.graph.node
               if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2
               and n.input[2] in inits and numpy_helper.to_array(inits[n.input[2]]).any()]
    found = []
    if int32:
        found.append(f"{len(int32)} DequantizeLinear with an int32 input (quantized biases, e.g. {int32[0]})")
    if shifted:
        found.append(f"{len(shifted)} Q/DQ nodes with a non-zero zero point (e.g. {shifted[0]})")
    if not found:
        return ""
    return ("TensorRT's ONNX parser refuses " + " and ".join(found) + ": quantize for it with "
            "quantize_static(..., activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, "
            "extra_options={'ActivationSymmetric': True, 'WeightSymmetric': True, 'QuantizeBias': False})")


def _low_precision(model) -> str:
    """"fp8" for a model whose Q/DQ nodes are all FP8, else "int8": the kernels' words."""
    if model is None:
        return "int8"
    types = qtypes.qdq_types(model)
    return "fp8" if types and types <= set(qtypes.FLOAT8) else "int8"


def _kernels(target: str, meta: dict, low: str = "int8") -> str:
    """What the target's run says of low-precision kernels: the comparison tests them only where
    they ran (``low``: "int8" or "fp8", the model's Q/DQ types)."""
    count = meta.get("int8_ops")
    if count is None:
        return ""
    if count < 0:
        return f"{target} did not say which kernels ran"
    if count == 0:
        return (
            f"no {low} kernel ran: {target} computed every op in float, so this compares fake-quant "
            "with fake-quant"
        )
    return f"{count} ops ran in {low} on {target}"


def judge_with(oracle, model, options, *, command: str = "check") -> QuantPolicy | None:
    """Set ``oracle``'s per-tensor judgement for ``model`` (None: not quantized, or the user's
    own tolerance holds). Only ``check`` compares with the fp32 twin: elsewhere
    ``--quant-reference fp32`` is a usage error, never silently ignored."""
    if command != "check" and options.quant_reference == QuantReference.FP32.value:
        raise UsageError(
            f"--quant-reference fp32 is for check: {command} compares with fake-quant, the "
            "model's own Q/DQ semantics",
            hint="drop --quant-reference (docs/quantized.md)",
        )
    given = options.tolerance is not None or options.atol is not None or options.rtol is not None
    try:  # the index (shape inference over the whole model) only for a model that holds quantized ops
        quantized = bool(quant.holds_quantized(model)) and not given
        policy = policy_for(model, GraphIndex.build(model), tolerance_given=given) if quantized else None
    except Exception:  # scales in external data not loaded: judged as any model, said by the caller
        policy = None
    oracle.quant = policy
    return policy


def run_twin(oracle, model, feeds: dict, workdir: str) -> tuple[dict | None, str]:
    """The fp32 twin's outputs on the reference engine, or (None, why not)."""
    try:
        twin = quant.fp32_twin(model)
    except ValueError as exc:
        return None, str(exc)
    path = save_model(twin, os.path.join(workdir, "fp32_twin.onnx"))
    result = oracle.run_reference(path, feeds)
    if result.status != "ok":
        return None, f"the fp32 twin did not run on {oracle.reference}: {result.message}"
    return dict(result.outputs), ""


def against_twin(oracle, result, twin_outputs: dict):
    """The target's verdict against the fp32 twin (``--quant-reference fp32``): the quantization's
    error counts too, so tensors are judged at the int8 tolerance, not in steps."""
    policy = oracle.quant
    if policy is not None:
        oracle.quant = dataclasses.replace(policy, steps={}, downstream=frozenset(twin_outputs))
    try:
        return oracle.verdict_from(result, twin_outputs)
    finally:
        oracle.quant = policy
