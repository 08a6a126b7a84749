"""What a TensorRT build is set up with and what its failures mean, apart from the backend that
runs it (:mod:`reprokit.engine.backends.trt`): the builder settings a target spec asks for (pure,
testable without TensorRT), loading TensorRT or TensorRT-RTX, polygraphy's log captured while a
build runs, and a failed build's messages turned into the right error (the GPU or driver, a
feature this TensorRT lacks, or the model).
Must not import tensorrt, or polygraphy's TensorRT modules, at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import sys
from dataclasses import dataclass, field

from reprokit.engine.backends.base import BuildError
from reprokit.engine.backends.trt_versions import TrtFacts, Typing, facts_for
from reprokit.errors import EngineUnavailable, InputError, ReprokitError, UsageError
from reprokit.graph import qtypes
from reprokit.graph.index import iter_nodes, node_names
from reprokit.spec import TargetSpec

TRT_HINT = (
    "pip install 'reprokit[tensorrt]' (needs an NVIDIA GPU and driver); for TensorRT-RTX: "
    "pip install tensorrt-rtx-cu13 (module tensorrt_rtx, with its -libs and -bindings wheels) and set "
    "POLYGRAPHY_USE_TENSORRT_RTX=1"
)
RTX_HINT = (
    "pip install tensorrt-rtx-cu13 (POLYGRAPHY_USE_TENSORRT_RTX=1 "
    "asks for TensorRT-RTX); or unset POLYGRAPHY_USE_TENSORRT_RTX and pip install 'reprokit[tensorrt]'"
)
NO_GPU_HINT = (  # appended to the install hint on a machine without an NVIDIA driver
    " — on a machine with an NVIDIA GPU; here, without one, --target emulate:fp16 or emulate:bf16 emulates "
    "TensorRT's fp16 or bf16 storage on the CPU (emulate:typed for a model you converted to fp16, as "
    "TensorRT 11 builds it)"
)


def no_gpu_hint(spec=None, engine: str = "TensorRT") -> str:
    """What runs here instead of ``engine`` on a GPU, for this target's precision: the emulator of
    the same storage (trt:bf16 is emulate:bf16 — emulate:fp16 would judge another precision), or,
    for a precision nothing emulates (TF32/fp32 matmuls, int8, fp8), that none does."""
    if spec is None:
        return NO_GPU_HINT
    narrow = [flag for flag in ("fp8", "int8", "bf16", "fp16") if spec.has(flag)]
    if narrow in (["fp16"], ["bf16"]):
        kept = spec.get("fp32-nodes")  # the emulator keeps the same nodes in fp32, same syntax
        stand_in = shlex.quote(f"emulate:{narrow[0]}" + (f",fp32-nodes={kept}" if kept else ""))
        typed = (f" (emulate:typed for a model you converted to {narrow[0]}, as TensorRT 11 builds it)"
                 if engine == "TensorRT" else "")
        return (f" — on a machine with an NVIDIA GPU; here, without one, --target {stand_in} emulates "
                f"{engine}'s {narrow[0]} storage on the CPU{typed}")
    what = "+".join(narrow) if narrow else ("fp32" if spec.has("no-tf32") else "TF32 (the default)")
    return (f" — on a machine with an NVIDIA GPU; here no CPU engine emulates {engine}'s {what} (emulate:fp16 "
            "and emulate:bf16 stand in for fp16 and bf16 storage only)")


_NARROW_FLAGS = ("fp16", "bf16", "int8", "fp8")
# TensorRT's words when the GPU or its driver, not the model, is the problem.
GPU_REFUSED = re.compile(
    r"compute capability|\bSM ?\d+\b.*not supported|GPU (architecture )?(is )?not supported|"
    r"CUDA initialization failure|no CUDA-capable device|cudaErrorNoDevice|insufficient driver|"
    r"driver version is insufficient|Could not load the CUDA runtime",
    re.IGNORECASE,
)
_MISSING_FEATURE = re.compile(r"is not available on TensorRT version", re.IGNORECASE)


def rtx_requested() -> bool:
    """True when POLYGRAPHY_USE_TENSORRT_RTX asks for TensorRT-RTX (polygraphy's own rule)."""
    return os.environ.get("POLYGRAPHY_USE_TENSORRT_RTX", "0") != "0"


@dataclass(frozen=True)
class BuilderSettings:
    """How to drive polygraphy's loaders for one target spec on one TensorRT."""

    mode: str  # "weakly-typed" or "strongly-typed"
    strongly_typed: bool  # ask for the STRONGLY_TYPED network flag
    config_loader: str  # "CreateConfig" or "CreateConfigRTX" (polygraphy.backend.tensorrt_rtx)
    create_config: dict = field(default_factory=dict)  # its kwargs, TensorRT enums left out
    config_flags: dict = field(default_factory=dict)  # BuilderFlag name → on, set afterwards
    workspace_bytes: int | None = None
    save_timing_cache: str | None = None
    convert_to: str | None = None  # strongly typed fp16/bf16: reprokit converts the ONNX
    fp32_nodes: tuple[str, ...] = ()
    fp32_layers: bool = False  # weak typing: pin the layers of fp32_nodes to FP32
    builder_flags: tuple[str, ...] = ()  # the BuilderFlags this asks for, for reports
    notes: tuple[str, ...] = ()
    facts: str = ""  # the key of the TrtFacts line this was decided from (trt_versions.FACTS)
    calibrate: bool = False  # weak INT8 on a model without Q/DQ: polygraphy's calibrator, same feeds


def has_qdq(model) -> bool:
    """Does the ONNX model (a ModelProto) quantize explicitly: a QuantizeLinear/DequantizeLinear node
    in its graph, its subgraphs or its functions?"""
    graphs = [model.graph, *(f for f in model.functions)]
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear")
               for g in graphs for n in (iter_nodes(g) if g is model.graph else g.node))


def fp32_nodes(spec: TargetSpec) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip())


def trt_layer_names(model) -> dict[str, str]:
    """``OP_INDEX`` label -> TensorRT layer name of the model's unnamed top-level nodes: the
    ONNX parser names an unnamed node's layer ``node_of_<its first output>`` and records that
    name as its origin (``[ONNX Layer: node_of_y]``; onnx-tensorrt getNodeName, seen with
    TensorRT-RTX 1.7's parser: tests/golden/trt_layer_names.txt)."""
    return {
        f"{node.op_type}_{index}": f"node_of_{node.output[0]}"
        for index, node in enumerate(model.graph.node)
        if not node.name and node.output
    }


def fp32_origins(model, nodes) -> dict[str, str]:
    """fp32-nodes label -> the origin TensorRT's parser records for its layers: a node's name,
    or for an unnamed top-level node given as OP_INDEX (as the CLI, the emulator and repro.py
    read it) ``node_of_<first output>``. A label that is neither is refused before any build."""
    unnamed = trt_layer_names(model)
    known = set(node_names(model.graph)) - {""}
    unknown = sorted(n for n in nodes if n not in known and n not in unnamed)
    if unknown:
        raise InputError(
            f"fp32-nodes names no node of the model: {', '.join(unknown)}",
            hint="use ONNX node names, or OP_INDEX (e.g. Mul_3) for an unnamed node",
        )
    return {n: n if n in known else unnamed[n] for n in nodes}


def compute_capabilities(spec: TargetSpec) -> list[tuple[int, int]]:
    """``compute-capability=8.9;12.0`` → [(8, 9), (12, 0)]; UsageError when malformed."""
    text = str(spec.get("compute-capability", ""))
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        major, dot, minor = part.partition(".")
        if not (dot and major.isdigit() and minor.isdigit()):
            raise UsageError(f"trt compute-capability needs MAJOR.MINOR values, got {part!r}",
                             hint="e.g. trt:compute-capability=8.9 or compute-capability=8.9;12.0")
        out.append((int(major), int(minor)))
    if not out:
        raise UsageError("trt compute-capability names none", hint="e.g. trt:compute-capability=8.9")
    return out


def builder_settings(spec: TargetSpec, version: int | str, rtx: bool, *, has_qdq: bool = True) -> BuilderSettings:
    """Loader arguments for ``spec`` on TensorRT ``version`` ("10.13.0", or a major number), or on
    TensorRT-RTX when ``rtx``, read from that version's line of :data:`trt_versions.FACTS`.
    ``has_qdq``: whether the model holds Q/DQ nodes (INT8/FP8 without them: calibrated or refused)."""
    text = f"{version}.0" if isinstance(version, int) else str(version)
    if not rtx and _major(text) < 8:
        raise EngineUnavailable(f"TensorRT {text} is too old: reprokit needs 8.6 or later", hint=TRT_HINT)
    facts = facts_for(text, rtx)
    refuse_unbuildable(spec, facts)  # the Q/DQ refusal is the original model's (TrtBackend.admit)
    strong = facts.default_typing is Typing.STRONG or spec.has("strongly-typed")
    tf32 = not spec.has("no-tf32")
    nodes = fp32_nodes(spec)
    common: dict = {}
    if spec.has("opt-level"):
        common["builder_optimization_level"] = spec.get("opt-level")
    cache = spec.get("timing-cache")
    if cache:
        common["load_timing_cache"] = cache
    workspace = spec.get("workspace")
    shared = dict(
        workspace_bytes=workspace * 2**20 if workspace else None, save_timing_cache=cache or None
    )
    if not strong:
        wanted = {p: spec.has(p) for p in _NARROW_FLAGS}
        flags = ["TF32"] if tf32 else []
        flags += [p.upper() for p in _NARROW_FLAGS if wanted[p]]
        kwargs = {"tf32": tf32, **wanted, **common}
        calibrate = wanted["int8"] and not has_qdq  # implicit INT8: calibrated as polygraphy --int8 does
        if nodes:
            kwargs["precision_constraints"] = "obey"
            flags.append("OBEY_PRECISION_CONSTRAINTS")
        return BuilderSettings(
            mode="weakly-typed", strongly_typed=False, config_loader="CreateConfig",
            create_config=kwargs, fp32_nodes=nodes, fp32_layers=bool(nodes),
            builder_flags=tuple(flags), facts=facts.key, calibrate=calibrate,
            notes=("INT8 calibrated by polygraphy's calibrator over the same inputs (no Q/DQ in the model), "
                   "as `polygraphy run --int8 --load-inputs` does",) if calibrate else (), **shared,
        )  # fmt: skip
    if spec.has("fp16") and spec.has("bf16"):
        raise UsageError(
            f"{spec}: a strongly typed build computes in one type, fp16 or bf16, not both",
            hint="drop one of fp16/bf16 (TensorRT ≥ 11 and TensorRT-RTX are always strongly typed)",
        )
    convert_to = next((p for p in ("fp16", "bf16") if spec.has(p)), None)
    notes = []
    if (spec.has("int8") or spec.has("fp8")) and not has_qdq:  # a shrink candidate cut off its Q/DQ
        notes.append("strongly typed: INT8/FP8 come only from Q/DQ nodes; this model has none left, "
                     "TensorRT computes it in the float types it states")
    elif spec.has("int8") or spec.has("fp8"):
        notes.append("strongly typed: INT8/FP8 come from the model's Q/DQ nodes, no builder flag")
    if nodes and not convert_to:
        notes.append("fp32-nodes has no effect: the model is not converted, it stays float32")
    if spec.has("compute-capability") and not rtx:
        notes.append("compute-capability applies to TensorRT-RTX only; ignored")
    if rtx:  # polygraphy's CreateConfigRTX takes no precision flags, TF32 is set afterwards
        target = ({"compute_capabilities": compute_capabilities(spec)} if spec.has("compute-capability")
                  else {"use_gpu": True})
        loader, kwargs, after = "CreateConfigRTX", {**target, **common}, {"TF32": tf32}
    else:
        loader, kwargs, after = "CreateConfig", {"tf32": tf32, **common}, {}
    return BuilderSettings(
        mode="strongly-typed", strongly_typed=True, config_loader=loader, create_config=kwargs,
        config_flags=after, convert_to=convert_to, fp32_nodes=nodes if convert_to else (),
        builder_flags=("TF32",) if tf32 else (), notes=tuple(notes), facts=facts.key, **shared,
    )  # fmt: skip


def refuse_unbuildable(spec: TargetSpec, facts: TrtFacts, has_qdq: bool = True) -> None:
    """Refuse a target this TensorRT cannot build as asked, rather than build something else and
    report it under the asked precision (issue 36): the verdict never names a precision that did
    not run. Facts from :mod:`trt_versions` (NVIDIA's 10.x→11.x migration guide)."""
    name = f"{facts.product} {facts.key}"
    strong = facts.default_typing is Typing.STRONG or spec.has("strongly-typed")
    if spec.has("strongly-typed") and not facts.strongly_typed_flag:
        raise EngineUnavailable(f"{name} has no strongly typed networks (NetworkDefinitionCreationFlag."
                                "STRONGLY_TYPED is TensorRT 10.0's)",
                                hint="drop strongly-typed on TensorRT 8.6, or use TensorRT 10 or later")
    if not strong and spec.has("bf16") and not facts.narrow_by_flag("bf16"):
        raise EngineUnavailable(f"{name} has no BF16 builder flag (BuilderFlag.BF16 is TensorRT 10.0's)",
                                hint="use trt:fp16 on TensorRT 8.6, or TensorRT 10 or later for bf16")
    if spec.has("fp8") and "FP8" not in facts.qdq_types:
        raise EngineUnavailable(f"{name}'s ONNX parser reads no FP8 QuantizeLinear/DequantizeLinear (INT8 ones "
                                "only; FP8 only as its own TRT_FP8QuantizeLinear op)",
                                hint="use TensorRT 10 or later for trt:fp8")
    wanted = [p for p in ("int8", "fp8") if spec.has(p)]
    if not wanted or has_qdq:
        return
    words = "/".join(p.upper() for p in wanted)
    quantize = ("quantize the model first (Q/DQ nodes): onnxruntime.quantization.quantize_static, or NVIDIA "
                "ModelOpt (python -m modelopt.onnx.quantization --onnx_path model.onnx --quantize_mode int8); "
                "or check trt:fp16")
    if strong:
        raise UsageError(f"`{spec}` on a model without Q/DQ nodes: {name} builds only explicitly quantized "
                         f"{words} (its precision builder flags and calibrators are gone), so the engine would run "
                         f"in float and the verdict would name {words} that never ran", hint=quantize)
    if spec.has("fp8"):
        raise UsageError(f"`{spec}` on a model without Q/DQ nodes: TensorRT has no FP8 calibrator, FP8 comes "
                         "only from FP8 Q/DQ nodes", hint=quantize.replace("int8", "fp8"))


def refuse_other_quantization(spec: TargetSpec, model) -> None:
    """``trt:fp8`` on a model whose Q/DQ nodes quantize to no FP8 type, or ``trt:int8`` on one
    with only FP8 Q/DQ: explicit quantization takes its precision from the Q/DQ types (no builder
    flag makes an int8 Q/DQ pair FP8), so the verdict would name a precision that did not run."""
    types = qtypes.qdq_types(model)
    if not types:
        return  # no Q/DQ: refuse_unbuildable's question (calibrators, strongly typed)
    fp8 = types & set(qtypes.FLOAT8)
    if spec.has("fp8") and not fp8:
        raise UsageError(
            f"`{spec}` on a model whose Q/DQ nodes are {'/'.join(sorted(types))}, no FP8: TensorRT runs "
            "Q/DQ in the type they name, so the engine would run that and the verdict would name FP8",
            hint="use trt:int8 for this model, or quantize it to FP8: quantize_static(..., "
            "activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN, "
            "calibrate_method=CalibrationMethod.Distribution) (docs/quantized.md)",
        )
    if spec.has("int8") and not spec.has("fp8") and not types - fp8:
        raise UsageError(
            f"`{spec}` on a model whose Q/DQ nodes are all FP8 ({'/'.join(sorted(types))}): TensorRT "
            "runs Q/DQ in the type they name, so the verdict would name INT8 that never ran",
            hint="use trt:fp8 for this model (docs/quantized.md)",
        )


def nvidia_driver_present() -> bool:
    """Whether this machine shows an NVIDIA driver (its kernel module, a device node or
    nvidia-smi): without one no TensorRT, installed or not, can build here."""
    import shutil

    return (os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")
            or shutil.which("nvidia-smi") is not None)


def load_tensorrt(spec=None):
    """Import the TensorRT module polygraphy will use; return (module, rtx). ``spec``, the target
    being run, words the hint of a machine without a GPU (none: a listing's generic words)."""
    import importlib

    rtx = rtx_requested()
    names = ("tensorrt_rtx", "tensorrt_rtx_bindings") if rtx else ("tensorrt",)
    errors, module = [], None
    for name in names:
        try:
            module = importlib.import_module(name)
            break
        except Exception as exc:  # missing, or its CUDA libraries fail to load
            errors.append(f"{name}: {exc.__class__.__name__}: {exc}")
    if module is None:
        what = "TensorRT-RTX (POLYGRAPHY_USE_TENSORRT_RTX=1)" if rtx else "TensorRT"
        hint = RTX_HINT if rtx else TRT_HINT
        no_gpu = ""
        if not nvidia_driver_present():  # installing it would not help here: say so
            no_gpu = ("; and this machine has no NVIDIA GPU driver (no /proc/driver/nvidia, no nvidia-smi): "
                      f"{what} cannot run here, installed or not")
            hint += no_gpu_hint(spec)
        raise EngineUnavailable(f"{what} is not importable here ({'; '.join(errors)}){no_gpu}", hint=hint)
    version = str(getattr(module, "__version__", "0"))
    if rtx:  # polygraphy imports "tensorrt_rtx"; the bindings wheel alone has another name
        sys.modules.setdefault("tensorrt_rtx", module)
    elif tuple(int(p) for p in re.findall(r"\d+", version)[:2]) < (8, 6):
        raise EngineUnavailable(
            f"TensorRT {version} is too old: reprokit needs 8.6 or later", hint=TRT_HINT
        )
    from polygraphy import config

    if config.USE_TENSORRT_RTX != rtx:
        # polygraphy binds its lazy TensorRT module when polygraphy.backend.trt is imported
        if "polygraphy.backend.trt" in sys.modules:
            raise EngineUnavailable(
                "polygraphy's TensorRT backend was already loaded for the other TensorRT flavour",
                hint="set POLYGRAPHY_USE_TENSORRT_RTX before reprokit starts",
            )
        config.USE_TENSORRT_RTX = rtx
    return module, rtx


def _major(version: str) -> int:
    found = re.match(r"\d+", version or "")
    return int(found.group()) if found else 0


class _LogCapture(logging.Handler):
    """Keeps polygraphy's log lines (TensorRT's own messages included) for reports and errors."""

    def __init__(self):
        super().__init__(level=1)
        self.records: list[tuple[int, str]] = []

    def emit(self, record):
        self.records.append((record.levelno, re.sub(r"^\[[A-Z!]\]\s*", "", record.getMessage())))

    def text(self) -> str:
        return "\n".join(message for _, message in self.records)

    def errors(self) -> list[str]:
        return [message for level, message in self.records if level >= logging.ERROR]


@contextlib.contextmanager
def capture_polygraphy_log():
    """Route polygraphy's G_LOGGER (INFO and up) into a :class:`_LogCapture`, then restore it."""
    from polygraphy.logger import G_LOGGER

    saved = (G_LOGGER.use_python_logging_system, G_LOGGER.colors, G_LOGGER.module_severity)
    G_LOGGER.use_python_logging_system = True
    G_LOGGER.colors = False
    if G_LOGGER.module_severity.get() > G_LOGGER.INFO:
        G_LOGGER.module_severity = G_LOGGER.INFO
    python_logger = G_LOGGER.python_logger
    kept = (python_logger.level, python_logger.propagate)
    capture = _LogCapture()
    python_logger.addHandler(capture)
    python_logger.setLevel(1)
    python_logger.propagate = False
    try:
        yield capture
    finally:
        python_logger.removeHandler(capture)
        python_logger.setLevel(kept[0])
        python_logger.propagate = kept[1]
        G_LOGGER.use_python_logging_system, G_LOGGER.colors = saved[0], saved[1]
        G_LOGGER.module_severity = saved[2]


def classify_failure(messages: list[str], rtx: bool = False) -> ReprokitError:
    """Turn TensorRT's messages about a failed build/run into the error reprokit reports."""
    lines = list(dict.fromkeys(m.strip() for m in messages if m and m.strip()))
    refused = [m for m in lines if GPU_REFUSED.search(m)]
    name = "TensorRT-RTX" if rtx else "TensorRT"
    if refused:
        return EngineUnavailable(
            f"{name} cannot use this GPU: {' / '.join(refused)}",
            hint="run on a GPU and driver this TensorRT supports"
            + ("; or unset POLYGRAPHY_USE_TENSORRT_RTX to use TensorRT" if rtx else ""),
        )
    missing = [m for m in lines if _MISSING_FEATURE.search(m)]
    if missing:
        return EngineUnavailable(
            f"{name} here lacks a feature this target needs: {missing[0]}", hint=TRT_HINT
        )
    first = next((m for m in lines if re.search(r"error", m, re.IGNORECASE)), lines[0] if lines else "")
    return BuildError(f"{name} could not build or run the model: {first}\n" + "\n".join(lines))
