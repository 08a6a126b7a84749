"""TensorRT backend through polygraphy's loaders (NetworkFromOnnxPath → CreateConfig →
EngineFromNetwork → TrtRunner), for TensorRT 8.6+ and TensorRT-RTX.

Two modes, picked by :func:`builder_settings` (pure, testable without TensorRT):

- weakly typed (TensorRT 8.6–10.x): precision comes from builder flags (FP16, BF16, INT8, FP8,
  TF32); ``fp32-nodes`` sets those layers' precision to FP32 under OBEY_PRECISION_CONSTRAINTS;
- strongly typed (TensorRT ≥ 11, TensorRT-RTX, or the ``strongly-typed`` option): there are no
  precision flags, the engine computes in the types the ONNX file states, so for fp16/bf16
  reprokit converts the model itself (:mod:`reprokit.convert`), ``fp32-nodes`` kept between Casts.

TensorRT's module is ``tensorrt``, or with POLYGRAPHY_USE_TENSORRT_RTX=1 TensorRT-RTX's
``tensorrt_rtx`` (the PyPI bindings wheel names it ``tensorrt_rtx_bindings``; it is aliased).
Must not import tensorrt, or polygraphy's TensorRT modules, at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

from reprokit.convert import convert_float_model_report, node_names
from reprokit.engine.backends.base import Availability, Backend, BuildError, RunResult
from reprokit.errors import EngineUnavailable, InputError, ReprokitError, UsageError
from reprokit.spec import OptionDoc, TargetSpec

TRT_HINT = (
    "pip install 'reprokit[tensorrt]' (needs an NVIDIA GPU and driver); for TensorRT-RTX: "
    "pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings and set POLYGRAPHY_USE_TENSORRT_RTX=1"
)
RTX_HINT = (
    "pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings (POLYGRAPHY_USE_TENSORRT_RTX=1 "
    "asks for TensorRT-RTX); or unset POLYGRAPHY_USE_TENSORRT_RTX and pip install 'reprokit[tensorrt]'"
)
_NARROW_FLAGS = ("fp16", "bf16", "int8", "fp8")
# TensorRT's words when the GPU or its driver, not the model, is the problem.
_GPU_REFUSED = re.compile(
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


def fp32_nodes(spec: TargetSpec) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip())


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


def builder_settings(spec: TargetSpec, trt_major: int, rtx: bool) -> BuilderSettings:
    """Loader arguments for ``spec`` on TensorRT ``trt_major`` (or TensorRT-RTX when ``rtx``)."""
    if not rtx and trt_major < 8:
        raise EngineUnavailable(
            f"TensorRT {trt_major} is too old: reprokit needs 8.6 or later", hint=TRT_HINT
        )
    strong = rtx or trt_major >= 11 or spec.has("strongly-typed")
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
        if nodes:
            kwargs["precision_constraints"] = "obey"
            flags.append("OBEY_PRECISION_CONSTRAINTS")
        return BuilderSettings(
            mode="weakly-typed", strongly_typed=False, config_loader="CreateConfig",
            create_config=kwargs, fp32_nodes=nodes, fp32_layers=bool(nodes),
            builder_flags=tuple(flags), **shared,
        )  # fmt: skip
    if spec.has("fp16") and spec.has("bf16"):
        raise UsageError(
            f"{spec}: a strongly typed build computes in one type, fp16 or bf16, not both",
            hint="drop one of fp16/bf16 (TensorRT ≥ 11 and TensorRT-RTX are always strongly typed)",
        )
    convert_to = next((p for p in ("fp16", "bf16") if spec.has(p)), None)
    notes = []
    if spec.has("int8") or spec.has("fp8"):
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
        builder_flags=("TF32",) if tf32 else (), notes=tuple(notes), **shared,
    )  # fmt: skip


def load_tensorrt():
    """Import the TensorRT module polygraphy will use; return (module, rtx)."""
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
        raise EngineUnavailable(
            f"{what} is not importable here ({'; '.join(errors)})",
            hint=RTX_HINT if rtx else TRT_HINT,
        )
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
    refused = [m for m in lines if _GPU_REFUSED.search(m)]
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


class TrtBackend(Backend):
    engine = "trt"
    summary = "TensorRT (or TensorRT-RTX) through polygraphy; weakly or strongly typed"
    OPTIONS = {
        "fp16": OptionDoc("FP16: builder flag (weak typing) / model converted to fp16 (strong)"),
        "bf16": OptionDoc("BF16: builder flag (weak typing) / model converted to bf16 (strong)"),
        "int8": OptionDoc("INT8 builder flag (weak typing); strongly typed: Q/DQ nodes only"),
        "fp8": OptionDoc("FP8 builder flag (weak typing); strongly typed: Q/DQ nodes only"),
        "no-tf32": OptionDoc("turn TF32 off: float32 matmuls and convolutions in full fp32"),
        "strongly-typed": OptionDoc("strongly typed network (always so on TensorRT ≥ 11 / RTX)"),
        "opt-level": OptionDoc("builder optimization level, 0-5 (TensorRT's default: 3)", "int"),
        "workspace": OptionDoc("workspace memory pool limit, in MiB", "int"),
        "timing-cache": OptionDoc("tactic timing cache file, loaded if present and saved", "path"),
        "fp32-nodes": OptionDoc(
            "keep these ONNX nodes in fp32, ';'-separated (fp32-nodes=a;b)", "str"
        ),
        "compute-capability": OptionDoc(
            "TensorRT-RTX: build for these compute capabilities (e.g. 8.9 or 8.9;12.0) instead "
            "of the current GPU; such an engine builds anywhere but runs only there",
            "str",
        ),
    }
    install_hint = TRT_HINT
    marking_changes_engine = True  # marked tensors cannot be fused away

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        if spec.has("compute-capability"):
            compute_capabilities(spec)
        level = spec.get("opt-level")
        if level is not None and not 0 <= level <= 5:
            raise UsageError(
                f"trt opt-level must be 0 to 5, got {level}", hint="e.g. trt:opt-level=3"
            )
        workspace = spec.get("workspace")
        if workspace is not None and workspace <= 0:
            raise UsageError(
                f"trt workspace must be a positive number of MiB, got {workspace}",
                hint="e.g. trt:workspace=4096",
            )
        if spec.has("strongly-typed") and spec.has("fp16") and spec.has("bf16"):
            raise UsageError(
                "trt:strongly-typed computes in one type: fp16 or bf16, not both",
                hint="e.g. trt:strongly-typed,fp16",
            )
        if spec.has("fp32-nodes") and not fp32_nodes(spec):
            raise UsageError(
                "trt fp32-nodes names no node", hint="e.g. trt:fp16,fp32-nodes=/ln/Add;/ln/Mul"
            )
        if fp32_nodes(spec) and not any(spec.has(p) for p in _NARROW_FLAGS):
            raise UsageError(
                "trt fp32-nodes only matters with a narrow precision: the target is float32",
                hint="add fp16, bf16, int8 or fp8, e.g. trt:fp16,fp32-nodes=NODE",
            )

    def precision(self) -> str:
        # bf16 before fp16: it keeps fewer mantissa bits, so its error is the larger one
        for name in ("fp8", "int8", "bf16", "fp16"):
            if self.spec.has(name):
                return name
        return "fp32" if self.spec.has("no-tf32") else "tf32"

    @classmethod
    def probe(cls) -> Availability:
        try:
            module, rtx = load_tensorrt()
        except EngineUnavailable as exc:  # the CLI adds install_hint; RTX needs other wheels
            extra = f"; {exc.hint}" if exc.hint != cls.install_hint else ""
            return Availability(False, None, exc.message + extra)
        version = str(getattr(module, "__version__", "?"))
        typing = (
            "strongly typed only" if rtx or _major(version) >= 11 else "weakly or strongly typed"
        )
        name = "TensorRT-RTX" if rtx else "TensorRT"
        return Availability(True, version, f"{name} {version} (module {module.__name__}; {typing})")

    def run(self, model_path, feeds, output_names):
        import onnx

        self.refuse_containers(feeds)
        module, rtx = load_tensorrt()
        version = str(getattr(module, "__version__", "?"))
        settings = builder_settings(self.spec, _major(version), rtx)
        model = onnx.load(model_path, load_external_data=False)
        unknown = sorted(set(settings.fp32_nodes) - set(node_names(model.graph)))
        if unknown:
            raise InputError(
                f"fp32-nodes names no node of the model: {', '.join(unknown)}",
                hint="use ONNX node names",
            )
        meta = {
            "mode": settings.mode, "trt_version": version, "trt_module": module.__name__,
            "builder_flags": list(settings.builder_flags), "strongly_typed": settings.strongly_typed,
            "converted_to": settings.convert_to, "fp32_nodes": list(settings.fp32_nodes),
            "notes": list(settings.notes),
        }  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="reprokit-trt-") as tmp:
            path = model_path
            if settings.convert_to:
                path = self._convert(model_path, settings, tmp, meta)
            with capture_polygraphy_log() as log:
                try:
                    outputs = _build_and_run(
                        module, rtx, settings, model, path, feeds, output_names, meta,
                        build_only=self.build_only,
                    )
                except ReprokitError:
                    raise
                except Exception as exc:  # PolygraphyException, or the bindings' own errors
                    raise classify_failure([*log.errors(), str(exc)], rtx) from exc
        return RunResult(outputs=outputs, meta=meta, log=log.text())

    @staticmethod
    def _convert(model_path, settings, tmp, meta) -> str:
        import onnx

        try:
            model, report = convert_float_model_report(
                onnx.load(model_path), settings.convert_to, frozenset(settings.fp32_nodes)
            )
        except ValueError as exc:
            raise InputError(f"cannot convert the model to {settings.convert_to}: {exc}") from exc
        if report.schema_fp32:  # e.g. bf16 before opset 22: most ops have no bfloat16 there
            meta["notes"].append(
                f"{len(report.schema_fp32)} nodes stay float32: the model's opset does not allow "
                f"{settings.convert_to} for them (first: {', '.join(report.schema_fp32[:5])})"
            )
        path = os.path.join(tmp, f"model_{settings.convert_to}.onnx")
        onnx.save(model, path, save_as_external_data=model.ByteSize() > 1_800_000_000)
        return path


def _build_and_run(trt, rtx, settings, model, path, feeds, output_names, meta, build_only=False):
    """Build the engine with polygraphy's loaders and run ``feeds`` once (unless build_only)."""
    import time

    from polygraphy.backend import trt as ptrt

    strongly_typed = settings.strongly_typed
    if strongly_typed and not hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        # TensorRT ≥ 11 and TensorRT-RTX type strongly without the flag; an older one lacks it
        strongly_typed = not (rtx or _major(trt.__version__) >= 11)
    network = ptrt.NetworkFromOnnxPath(path, strongly_typed=strongly_typed)
    if settings.fp32_layers:
        matched: dict[str, list[str]] = {}
        network = ptrt.PostprocessNetwork(
            network, _pin_fp32(trt, settings.fp32_nodes, model, matched), "reprokit-fp32-nodes"
        )
        meta["fp32_layers"] = matched
    if output_names:
        network = ptrt.PostprocessNetwork(
            network, _mark_exactly(list(output_names)), "reprokit-mark-outputs"
        )
    kwargs = dict(settings.create_config)
    if settings.workspace_bytes:
        kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: settings.workspace_bytes}
    profile = _static_profile(model, feeds)
    if profile is not None:
        kwargs["profiles"] = [profile]
    if settings.config_loader == "CreateConfigRTX":
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX

        config = CreateConfigRTX(**kwargs)
    else:
        config = ptrt.CreateConfig(**kwargs)
    if settings.config_flags:
        config = ptrt.PostprocessConfig(config, _set_flags(trt, settings.config_flags))
    started = time.monotonic()
    if build_only:
        # Serialize only: deserializing needs a runtime that supports this GPU, and a
        # build-error hunt only asks whether the build succeeds.
        ptrt.EngineBytesFromNetwork(network, config=config, save_timing_cache=settings.save_timing_cache)()
        meta["build_seconds"] = round(time.monotonic() - started, 3)
        return {}
    engine = ptrt.EngineFromNetwork(network, config=config, save_timing_cache=settings.save_timing_cache)()
    meta["build_seconds"] = round(time.monotonic() - started, 3)
    with ptrt.TrtRunner(engine) as runner:
        wanted = set(runner.get_input_metadata().keys())
        raw = runner.infer({k: np.ascontiguousarray(v) for k, v in feeds.items() if k in wanted})
    if settings.fp32_layers:
        meta["fp32_nodes_unmatched"] = [n for n in settings.fp32_nodes if n not in matched]
    outputs = {}
    for name in list(output_names) if output_names else list(raw):
        value = np.array(raw[name], copy=True)  # the runner reuses its host buffers
        narrow = value.dtype.kind == "f" and value.itemsize < 4  # marked fp16 tensors
        outputs[name] = value.astype(np.float32) if narrow else value
    return outputs


def _static_profile(model, feeds):
    """An optimization profile pinned to the feed shapes, for inputs with dynamic dimensions."""
    from polygraphy.backend.trt import Profile

    inits = {t.name for t in model.graph.initializer}
    profile, dynamic = Profile(), False
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in inits or vi.name not in feeds or all(d.HasField("dim_value") for d in dims):
            continue
        shape = tuple(np.shape(feeds[vi.name]))
        profile.add(vi.name, min=shape, opt=shape, max=shape)
        dynamic = True
    return profile if dynamic else None


def _mark_exactly(names: list[str]):
    """Make exactly ``names`` the network outputs (polygraphy's marking treats '[' as a glob)."""

    def mark_exactly(network):
        tensors = {
            network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)
        }
        for layer in network:
            for i in range(layer.num_outputs):
                tensors[layer.get_output(i).name] = layer.get_output(i)
        missing = [n for n in names if n not in tensors]
        if missing:
            raise BuildError(
                f"TensorRT's network has no tensor {', '.join(map(repr, missing))} to mark as output",
                hint="TensorRT's ONNX parser folded it away; pick a neighbouring tensor",
            )
        for tensor in [network.get_output(i) for i in range(network.num_outputs)]:
            network.unmark_output(tensor)
        for name in names:
            network.mark_output(tensors[name])

    return mark_exactly


def _pin_fp32(trt, nodes, model, matched: dict):
    """Set FP32 precision and output types on the layers TensorRT made from ``nodes``."""
    onnx_names = {n.name for n in model.graph.node}
    wanted = set(nodes)
    floats = {getattr(trt, t) for t in ("float32", "float16", "bfloat16") if hasattr(trt, t)}

    def origin(layer) -> str | None:
        # TensorRT ≥ 10 records "[ONNX Layer: NAME]"; before, layers carry NAME or NAME_<n>
        found = re.search(r"\[ONNX Layer: (.*?)\]", getattr(layer, "metadata", "") or "")
        if found:
            return found.group(1)
        if layer.name in onnx_names:
            return layer.name
        base = re.sub(r"_\d+$", "", layer.name)
        return base if base in onnx_names else None

    def pin_fp32(network):
        for layer in network:
            node = origin(layer)
            outs = [layer.get_output(i) for i in range(layer.num_outputs)]
            if node not in wanted or not all(o.dtype in floats for o in outs):
                continue  # shape and index layers keep their types
            layer.precision = trt.float32
            for i in range(len(outs)):
                layer.set_output_type(i, trt.float32)
            matched.setdefault(node, []).append(layer.name)

    return pin_fp32


def _set_flags(trt, flags: dict):
    def set_flags(builder, network, config):
        for name, on in flags.items():
            flag = getattr(trt.BuilderFlag, name, None)
            if flag is not None:
                (config.set_flag if on else config.clear_flag)(flag)

    return set_flags
