"""The one table of TensorRT facts per version line: how a network is typed there, which
precision builder flags, calibrators, debug tensors and trtexec options exist, and what each
``trt:`` option of reprokit means on it. The backend (:mod:`trt_setup`), repro.py (the table is
embedded in its SETTINGS), commands.sh, ISSUE.md and docs/cli.md read it; nothing else guesses.

Sources (checked with the docs search, Nov 2026):
- TensorRT 10.x→11.x migration guide, "Removed Python APIs and Replacements": BuilderFlag.FP16,
  BF16, INT8, FP8, INT4, FP4, OBEY/PREFER_PRECISION_CONSTRAINTS and IBuilderConfig.int8_calibrator
  are removed in 11.x ("Strong typing with ModelOpt AutoCast" / "Explicit quantization with Q/DQ
  nodes" / "Strong typing (always enforced)").
- The trtexec migration page (10.x→11.x): --fp16, --bf16, --fp8, --int4, --best, --int8 and
  --calib are removed; "--stronglyTyped is no longer needed: it is always enabled".
- TensorRT 10.12 release notes: weak typing deprecated (the 11.x guide's "deprecated in 10.12").
- INetworkDefinition::markDebug and IDebugListener exist from TensorRT 10.0 (C++ API 10.0.1);
  NetworkDefinitionCreationFlag.STRONGLY_TYPED and BuilderFlag.BF16 are 10.0's (not in 8.6).
- TensorRT-RTX: strongly typed only; polygraphy selects it with POLYGRAPHY_USE_TENSORRT_RTX=1.
- ONNX parser (onnx-tensorrt release/8.6-GA, builtin_op_importers.cpp): QuantizeLinear and
  DequantizeLinear import as INT8 only; FP8 exists there only as the parser's own
  TRT_FP8QuantizeLinear/TRT_FP8DequantizeLinear ops. release/10.0-GA reads FLOAT8E4M3FN Q/DQ.
Must not import tensorrt: the facts are data, checked against the installed bindings at run time.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum


class Typing(str, Enum):
    WEAK = "weakly-typed"
    STRONG = "strongly-typed"


@dataclass(frozen=True)
class TrtFacts:
    """What one TensorRT version line offers, as NVIDIA documents it."""

    key: str  # "8.6", "10.0-10.11", "10.12+", "11", "rtx"
    product: str  # "TensorRT" or "TensorRT-RTX"
    default_typing: Typing
    precision_flags: tuple[str, ...]  # BuilderFlag names that turn on a narrow precision
    weak_deprecated: bool  # builder precision flags still work but are deprecated
    strongly_typed_flag: (
        bool  # NetworkDefinitionCreationFlag.STRONGLY_TYPED / --stronglyTyped exist
    )
    calibrators: bool  # implicit INT8 (a calibrator, no Q/DQ) possible
    layer_precisions: bool  # per-layer precision + OBEY_PRECISION_CONSTRAINTS
    debug_tensors: bool  # INetworkDefinition.mark_debug (polygraphy --mark-debug)
    trtexec_precision: tuple[str, ...]  # trtexec's precision switches
    source: str
    qdq_types: tuple[str, ...] = ("INT8", "FP8")  # the types the ONNX parser reads Q/DQ nodes as

    @property
    def weak_typing(self) -> bool:
        return bool(self.precision_flags)

    def narrow_by_flag(self, precision: str) -> bool:
        """Can ``precision`` (fp16, bf16, int8, fp8) be turned on by a builder flag here?"""
        return precision.upper() in self.precision_flags

    def to_json(self) -> dict:
        return {**asdict(self), "default_typing": self.default_typing.value}


_MIGRATION = (
    "https://docs.nvidia.com/deeplearning/tensorrt/latest/api/migration/tensorrt-10x-to-11x.html"
)
FACTS: tuple[TrtFacts, ...] = (
    TrtFacts("8.6", "TensorRT", Typing.WEAK, ("FP16", "INT8", "FP8"), False, False, True, True, False,
             ("--fp16", "--int8", "--fp8", "--best"), "TensorRT 8.6 API: no BF16, no STRONGLY_TYPED; "
             "its ONNX parser reads INT8 Q/DQ only", qdq_types=("INT8",)),
    TrtFacts("10.0-10.11", "TensorRT", Typing.WEAK, ("FP16", "BF16", "INT8", "FP8"), False, True, True, True,
             True, ("--fp16", "--bf16", "--int8", "--fp8", "--best"), "TensorRT 10.0 API"),
    TrtFacts("10.12+", "TensorRT", Typing.WEAK, ("FP16", "BF16", "INT8", "FP8"), True, True, True, True, True,
             ("--fp16", "--bf16", "--int8", "--fp8", "--best"), "TensorRT 10.12 release notes (deprecation)"),
    TrtFacts("11", "TensorRT", Typing.STRONG, (), False, True, False, False, True, (), _MIGRATION),
    TrtFacts("rtx", "TensorRT-RTX", Typing.STRONG, (), False, True, False, False, True, (),
             "https://docs.nvidia.com/deeplearning/tensorrt-rtx/latest/"),
)  # fmt: skip
BY_KEY = {f.key: f for f in FACTS}


def version_tuple(version: str | None) -> tuple[int, int]:
    parts = [int(p) for p in re.findall(r"\d+", version or "")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def facts_for(version: str | None, rtx: bool = False) -> TrtFacts:
    """The facts of TensorRT ``version`` (e.g. "10.13.0.35"), or of TensorRT-RTX when ``rtx``.
    A version before 8.6 gets 8.6's line: the caller refuses it (:func:`supported`)."""
    if rtx:
        return BY_KEY["rtx"]
    major, minor = version_tuple(version)
    if major >= 11:
        return BY_KEY["11"]
    if major == 10:
        return BY_KEY["10.12+" if minor >= 12 else "10.0-10.11"]
    return BY_KEY["8.6"]


def supported(version: str | None, rtx: bool = False) -> bool:
    return rtx or version_tuple(version) >= (8, 6)


# What each option of a ``trt:`` target means per typing: docs/cli.md's table is written from this.
MEANING = {
    "fp16": ("builder flag FP16: TensorRT may pick fp16 kernels for any layer",
             "no flag: reprokit converts the model to fp16 (float32 graph I/O, Casts around fp32-nodes) "
             "and builds that file, `model.fp16.onnx` in the archive"),
    "bf16": ("builder flag BF16 (10.0+; 8.6 has none)",
             "no flag: reprokit converts the model to bf16 and builds `model.bf16.onnx`"),
    "int8": ("builder flag INT8; without Q/DQ nodes implicit quantization calibrated by polygraphy's "
             "calibrator over the same inputs as the printed `polygraphy run --int8 --load-inputs`; a model "
             "whose Q/DQ nodes are all FP8 is refused",
             "only a model with int8 Q/DQ nodes; a model without them, or with FP8 ones only, is refused "
             "(quantize it first)"),
    "fp8": ("builder flag FP8, for FP8 Q/DQ nodes only (no FP8 calibrator: a model without them, or with int8 "
            "ones only, is refused); 10.0+: 8.6's ONNX parser reads no FP8 QuantizeLinear",
            "only a model with FP8 Q/DQ nodes; a model without them, or with int8 ones only, is refused"),
    "fp32-nodes": ("every layer made from those nodes gets precision float32 and OBEY_PRECISION_CONSTRAINTS "
                   "(found by the origin TensorRT's parser records; an unnamed node given as `OP_INDEX` "
                   "is its `node_of_<first output>`)",
                   "Casts keep those nodes float32 inside the converted model"),
    "no-tf32": ("TF32 builder flag cleared", "TF32 builder flag cleared"),
    "strongly-typed": ("NetworkDefinitionCreationFlag.STRONGLY_TYPED (10.0+; refused on 8.6)",
                       "always so; the flag is accepted and changes nothing"),
}  # fmt: skip


def markdown_table() -> str:
    """docs/cli.md's two tables, written from :data:`FACTS` and :data:`MEANING` (a test keeps the
    docs equal to this): what each version line has, and what each ``trt:`` option means."""
    rows = [
        "| version | typing | precision builder flags | trtexec precision switches | "
        "STRONGLY_TYPED / `--stronglyTyped` | calibrators | debug tensors |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in FACTS:
        name = f.product if f.key == "rtx" else f"{f.product} {f.key}"
        typing = f.default_typing.value + (" (deprecated)" if f.weak_deprecated else "")
        strong = (
            ("always on; accepted" if f.default_typing is Typing.STRONG else "yes")
            if f.strongly_typed_flag
            else "no"
        )
        rows.append(
            f"| {name} | {typing} | {', '.join(f.precision_flags) or 'none (removed)'} | "
            f"{' '.join(f'`{t}`' for t in f.trtexec_precision) or 'none (removed)'} | {strong} | "
            f"{'yes' if f.calibrators else 'no'} | {'yes' if f.debug_tensors else 'no'} |"
        )
    rows += [
        "",
        "| option | weakly typed (8.6–10.x) | strongly typed (11.x, TensorRT-RTX, `strongly-typed`) |",
        "| --- | --- | --- |",
    ]
    rows += [f"| `{option}` | {weak} | {strong} |" for option, (weak, strong) in MEANING.items()]
    return "\n".join(rows)
