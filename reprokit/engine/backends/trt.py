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
Builder settings, loading TensorRT and reading its failures are :mod:`trt_setup`'s.
Must not import tensorrt, or polygraphy's TensorRT modules, at import time.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np

from reprokit.convert import convert_float_model_report
from reprokit.engine.backends.base import Availability, Backend, BuildError, RunResult
from reprokit.engine.backends.trt_setup import (
    _NARROW_FLAGS,
    TRT_HINT,
    _major,
    builder_settings,
    capture_polygraphy_log,
    classify_failure,
    compute_capabilities,
    fp32_nodes,
    fp32_origins,
    has_qdq,
    load_tensorrt,
    refuse_other_quantization,
    refuse_unbuildable,
    rtx_requested,
    trt_layer_names,
)
from reprokit.engine.backends.trt_versions import facts_for
from reprokit.engine.envinfo import tensorrt_version
from reprokit.errors import EngineUnavailable, InputError, ReprokitError, UsageError
from reprokit.graph.model import OBSERVE_KEY
from reprokit.spec import OptionDoc, TargetSpec


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

    @classmethod
    def admit(cls, spec: TargetSpec, model) -> None:
        """Refuse, before any run, what the installed TensorRT cannot build as asked: INT8/FP8 on a
        model without Q/DQ where only explicit quantization exists (11, RTX, strongly-typed), FP8
        without Q/DQ anywhere. Read from the installed version's facts, without importing TensorRT
        (where none is installed the run says so, exit 4). On a Q/DQ model the precision is the
        Q/DQ nodes' own type on every TensorRT: ``trt:fp8`` on int8 Q/DQ (or ``trt:int8`` on FP8
        Q/DQ) would name a precision that never ran, so it is refused whatever is installed."""
        refuse_other_quantization(spec, model)
        rtx = rtx_requested()
        version = tensorrt_version()["version"]
        if not (spec.has("int8") or spec.has("fp8")) or (version is None and not rtx):
            return
        refuse_unbuildable(spec, facts_for(version, rtx), has_qdq(model))

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
            extra = f"; {exc.hint}" if not exc.hint.startswith(cls.install_hint) else ""
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
        module, rtx = load_tensorrt(self.spec)
        version = str(getattr(module, "__version__", "?"))
        model = onnx.load(model_path, load_external_data=False)
        settings = builder_settings(self.spec, version, rtx, has_qdq=has_qdq(model))
        origins = fp32_origins(model, settings.fp32_nodes)  # OP_INDEX -> node_of_<output>
        meta = {
            "mode": settings.mode, "trt_version": version, "trt_module": module.__name__,
            "builder_flags": list(settings.builder_flags), "strongly_typed": settings.strongly_typed,
            "converted_to": settings.convert_to, "fp32_nodes": list(settings.fp32_nodes),
            "notes": list(settings.notes), "trt_facts": settings.facts, "calibrated": settings.calibrate,
            "built_file": "model.onnx",
        }  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="reprokit-trt-") as tmp:
            path = model_path
            if settings.convert_to:
                path = self._convert(model_path, settings, tmp, meta)
                meta["built_file"] = f"model.{settings.convert_to}.onnx"  # its name in an archive
            with capture_polygraphy_log() as log:
                try:
                    outputs = _build_and_run(
                        module, rtx, settings, model, origins, path, feeds, output_names, meta,
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


def _build_and_run(trt, rtx, settings, model, origins, path, feeds, output_names, meta, build_only=False):
    """Build the engine with polygraphy's loaders and run ``feeds`` once (unless build_only);
    ``origins``: fp32-nodes label -> the origin TensorRT records for its layers (fp32_origins)."""
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
            network, _pin_fp32(trt, origins, _parser_origins(model), matched), "reprokit-fp32-nodes"
        )
        meta["fp32_layers"] = matched
    observed = _observed(model, output_names)
    if output_names:
        network = ptrt.PostprocessNetwork(
            network, _mark_exactly(list(output_names), observed, meta), "reprokit-mark-outputs"
        )
    kwargs = dict(settings.create_config)
    if settings.workspace_bytes:
        kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: settings.workspace_bytes}
    profile = _static_profile(model, feeds)
    if profile is not None:
        kwargs["profiles"] = [profile]
    if settings.calibrate:
        # what `polygraphy run --int8 --load-inputs inputs.json` does: polygraphy's Calibrator
        # (IInt8EntropyCalibrator2 by default) over the very inputs this run feeds
        wanted_inputs = {vi.name for vi in model.graph.input}
        kwargs["calibrator"] = ptrt.Calibrator(data_loader=[{k: v for k, v in feeds.items() if k in wanted_inputs}])
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
        if name not in raw and name in observed:  # fused away (unfused debug tensors): reported missing
            continue
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


def _observed(model, output_names) -> set[str]:
    """The requested names a layerwise run only observes: tensors other nodes read, in a model
    marked for observation (graph.model.OBSERVE_KEY). Elsewhere (shrink's candidates) none."""
    if not output_names or not any(p.key == OBSERVE_KEY for p in model.metadata_props):
        return set()
    read = {name for node in model.graph.node for name in node.input}
    return set(output_names) & read


def _mark_exactly(names: list[str], observed: set[str], meta: dict):
    """Make exactly ``names`` the network outputs (polygraphy's marking treats '[' as a glob);
    ``observed`` ones are read as debug tensors where this TensorRT has them (10.0+): the
    engine keeps its fusions, unlike with every tensor marked as an output (issue 36)."""

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
        debug = set()
        if observed and hasattr(network, "mark_unfused_tensors_as_debug_tensors"):
            network.mark_unfused_tensors_as_debug_tensors()  # what survives fusion, fusions unchanged
            debug = observed
            meta["observed_by"] = ("unfused debug tensors (mark_unfused_tensors_as_debug_tensors): fusions kept; "
                                   "a tensor fused away is missing from the table")
        elif observed and hasattr(network, "mark_debug"):
            for name in observed:
                network.mark_debug(tensors[name])
            debug = observed
            meta["observed_by"] = "debug tensors (mark_debug), not network outputs"
        elif observed:
            meta["observed_by"] = ("network outputs: this TensorRT has no debug tensors (8.6), so marking "
                                   "may stop fusions and measure another engine")
        for name in names:
            if name not in debug:
                network.mark_output(tensors[name])

    return mark_exactly


def _parser_origins(model) -> set[str]:
    """Every origin TensorRT's parser can record for the model's top-level nodes."""
    return {n.name for n in model.graph.node if n.name} | set(trt_layer_names(model).values())


def _pin_fp32(trt, origins: dict[str, str], known: set[str], matched: dict):
    """Set FP32 precision and output types on every layer TensorRT made from the fp32-nodes:
    ``origins`` maps each label to the origin the parser records (a node's first layer is NODE,
    its later ones NODE_<counter>, an unnamed node's node_of_<first output>: Gemm "fc" with a bias
    is layers fc and fc_0; tests/golden/trt_layer_names.txt). ``known``: every node's origin (a
    layer ln_1 before metadata is node ln_1's, not ln's). ``matched``: label -> layer names."""
    label_of = {origin: label for label, origin in origins.items()}
    onnx_names, wanted = known, set(label_of)
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
            matched.setdefault(label_of[node], []).append(layer.name)

    return pin_fp32


def _set_flags(trt, flags: dict):
    def set_flags(builder, network, config):
        for name, on in flags.items():
            flag = getattr(trt.BuilderFlag, name, None)
            if flag is not None:
                (config.set_flag if on else config.clear_flag)(flag)

    return set_flags
