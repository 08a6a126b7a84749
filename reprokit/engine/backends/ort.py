"""onnxruntime backend: the default reference (CPU, fp32, graph optimizations off).

``ort:opt`` turns ORT's graph optimizations on (a CPU target with real fusions);
``ort:cuda[,no-tf32|fp16|bf16]`` (:mod:`reprokit.engine.backends.ort_cuda`: the model converted by
reprokit for fp16/bf16, a CPU fallback refused) and ``ort:trt[,fp16]`` need onnxruntime-gpu.
"""

from __future__ import annotations

import os
import tempfile

from reprokit.engine.backends.base import (
    Availability,
    Backend,
    BuildError,
    RunResult,
    module_version,
)
from reprokit.engine.backends.ort_cuda import (
    CUDA,
    INSTALL_HINT,
    cuda_library_error,
    cuda_provider,
    environment_error,
    environment_failure,
    gpu_meta,
    narrow_session,
    refuse_cpu_fallback,
    require_cuda_build,
)
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.spec import OptionDoc, TargetSpec

_QUANT_LIMIT = 64 << 20  # a Q/DQ model's file is read for the marker only up to this size


def _quantizes(model_path: str) -> bool:
    """Does the (small enough) model file hold a QuantizeLinear? A byte search, no parse."""
    try:
        if os.path.getsize(model_path) > _QUANT_LIMIT:
            return False
        with open(model_path, "rb") as handle:
            return b"QuantizeLinear" in handle.read()
    except OSError:
        return False


def _integer_kernels(optimized_path: str) -> int:
    """The int8 kernels in the graph onnxruntime optimized (its QDQ fusions: QLinear*, QGemm,
    MatMulInteger*, ConvInteger); the Q/DQ it left run as fake-quant."""
    import onnx

    try:
        graph = onnx.load(optimized_path, load_external_data=False).graph
    except Exception:  # the optimized file is onnxruntime's; unreadable means unknown, not zero
        return -1
    return sum(1 for n in graph.node if n.op_type.startswith("QLinear") or n.op_type == "QGemm"
               or "Integer" in n.op_type)


def make_session(model_path: str, *, optimize: bool = False, providers=None, threads: int = 0,
                 weights_dir: str | None = None, optimized_path: str | None = None):
    """An InferenceSession on a model file; parse/load failures become BuildError.
    ``optimized_path``: where onnxruntime writes the graph it optimized (what kernels it chose)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if optimized_path:
        options.optimized_model_filepath = optimized_path
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    # Warnings too (an optimizer that cannot apply a rewrite): this runs in a worker process whose
    # output is the run's engine log, never the console (reprokit.engine.enginelog).
    options.log_severity_level = 2
    if threads:
        options.intra_op_num_threads = threads
    if weights_dir:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         os.path.abspath(weights_dir))
    try:
        return ort.InferenceSession(
            model_path, options, providers=providers or ["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT raises its own pybind exception types
        raise BuildError(f"onnxruntime could not load the model: {exc}") from exc


def run_session(session, feeds, output_names):
    feeds = {k: v for k, v in feeds.items() if v is not None}  # an empty optional input is left out
    names = output_names or [o.name for o in session.get_outputs()]
    narrow_out = {o.name for o in session.get_outputs() if _narrow_element(o.type) is not None}
    try:
        if any(_is_narrow(v) for v in feeds.values()) or narrow_out & set(names):
            return dict(zip(names, _run_raw(session, names, feeds)))
        values = session.run(names, feeds)
    except Exception as exc:
        raise BuildError(f"onnxruntime failed to run the model: {exc}") from exc
    return dict(zip(names, values))


# onnxruntime's Python API cannot take or give the dtypes numpy only knows through ml_dtypes
# (bfloat16, float8, int4/int2, float4): those travel as OrtValues holding ONNX's own raw bytes,
# converted both ways by onnx's numpy_helper (which packs and unpacks the sub-byte types).

def _is_narrow(value) -> bool:
    return getattr(getattr(value, "dtype", None), "isbuiltin", 1) == 2  # a user-defined numpy dtype


def _narrow_element(type_text: str):
    """The ONNX element type of ``tensor(bfloat16)`` & co. when numpy needs ml_dtypes for it."""
    import numpy as np
    from onnx import TensorProto, helper

    if not (type_text.startswith("tensor(") and type_text.endswith(")")):
        return None
    element = getattr(TensorProto, type_text[len("tensor("):-1].upper(), None)
    if element is None:
        return None
    try:
        return element if np.dtype(helper.tensor_dtype_to_np_dtype(element)).isbuiltin == 2 else None
    except (KeyError, TypeError, ValueError):
        return None


def _run_raw(session, names, feeds):
    import ctypes

    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    values = {}
    for name, value in feeds.items():
        array = np.ascontiguousarray(value)
        if not _is_narrow(array):
            values[name] = ort.OrtValue.ortvalue_from_numpy(array)
            continue
        raw = numpy_helper.from_array(array, name).raw_data
        values[name] = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape),
                                                                 helper.np_dtype_to_tensor_dtype(array.dtype))
        ctypes.memmove(values[name].data_ptr(), raw, len(raw))
    return [_to_numpy(v) for v in session.run_with_ort_values(names, values)]


def _to_numpy(value):
    import ctypes

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    element = _narrow_element(value.data_type())
    if element is None:
        return value.numpy()
    shape = list(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    dtype = helper.tensor_dtype_to_np_dtype(element)
    raw = ctypes.string_at(value.data_ptr(), (count * _bits(dtype) + 7) // 8) if count else b""
    return numpy_helper.to_array(onnx.TensorProto(name="out", data_type=element, dims=shape, raw_data=raw))


def _bits(dtype) -> int:
    """Bits per element of an ml_dtypes type (16 for bfloat16, 8 for float8, 4 for int4 …)."""
    import ml_dtypes

    try:
        return ml_dtypes.finfo(dtype).bits
    except (TypeError, ValueError):
        return ml_dtypes.iinfo(dtype).bits


GPU_TARGETS = "ort:cuda (TF32), ort:cuda,no-tf32, ort:cuda,fp16, ort:cuda,bf16 (fp32-nodes=a;b with fp16/bf16)"


def _gpu_targets(providers) -> str:
    """Whether the CUDA targets can run here, and if not, what is missing."""
    if CUDA not in providers:
        return f"{GPU_TARGETS}: no, onnxruntime-gpu is not installed ({INSTALL_HINT})"
    missing = cuda_library_error()
    if missing:
        return f"{GPU_TARGETS}: no, the CUDA provider cannot load: {missing}"
    return f"{GPU_TARGETS}: yes (the CUDA provider loads; a GPU is still needed at run time)"


class OrtBackend(Backend):
    engine = "ort"
    summary = "onnxruntime, CPU fp32, graph optimizations off (the default reference)"
    OPTIONS = {
        "opt": OptionDoc("enable all ORT graph optimizations (fusions) instead of none"),
        "cuda": OptionDoc("CUDA execution provider, TF32 on as onnxruntime's default (needs onnxruntime-gpu and a GPU)"),
        "trt": OptionDoc("TensorRT execution provider (needs onnxruntime-gpu with TensorRT)"),
        "fp16": OptionDoc("with cuda: the model converted to fp16 by reprokit (float32 graph I/O) and run on "
                          "CUDA kernels; with trt: FP16 in the TensorRT execution provider"),
        "bf16": OptionDoc("with cuda: the model converted to bf16 by reprokit (float32 graph I/O)"),
        "no-tf32": OptionDoc("with cuda: TF32 off (the CUDA provider's use_tf32=0): float32 MatMul/Conv in full fp32"),
        "fp32-nodes": OptionDoc("with cuda,fp16|bf16: keep these nodes in fp32 between Casts, "
                                "';'-separated (fp32-nodes=a;b)", "str"),
    }
    deterministic = True
    reads_weights_dir = True
    install_hint = "pip install onnxruntime  (GPU providers: pip install 'reprokit[gpu]')"

    def __init__(self, spec: TargetSpec):
        super().__init__(spec)
        # GPU providers pick kernels (cuDNN's algorithm search, TensorRT's tactics) per session:
        # shrink replays them as it does every engine that is not deterministic.
        self.deterministic = not (spec.has("cuda") or spec.has("trt"))
        self.runs_nodes_as_written = not (spec.has("cuda") or spec.has("trt") or spec.has("opt"))

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        if spec.has("cuda") and spec.has("trt"):
            raise UsageError("ort takes one GPU provider: cuda or trt", hint="e.g. --target ort:cuda,fp16")
        if spec.has("fp16") and spec.has("bf16"):
            raise UsageError("ort takes one narrow type: fp16 or bf16", hint="e.g. --target ort:cuda,fp16")
        if spec.has("fp16") and not (spec.has("trt") or spec.has("cuda")):
            raise UsageError("ort:fp16 needs a GPU provider", hint="use --target ort:cuda,fp16 (or ort:trt,fp16)")
        if spec.has("bf16") and not spec.has("cuda"):
            raise UsageError("ort:bf16 needs the cuda provider", hint="use --target ort:cuda,bf16")
        if spec.has("no-tf32") and not spec.has("cuda"):
            raise UsageError("ort no-tf32 is a CUDA provider setting", hint="use --target ort:cuda,no-tf32")
        if spec.has("fp32-nodes"):
            nodes = [n for n in str(spec.get("fp32-nodes", "")).split(";") if n.strip()]
            if not nodes:
                raise UsageError("ort fp32-nodes names no node", hint="e.g. ort:cuda,fp16,fp32-nodes=/ln/Add;/ln/Mul")
            if not (spec.has("cuda") and (spec.has("fp16") or spec.has("bf16"))):
                raise UsageError("ort fp32-nodes only matters on cuda with a narrow type: the model is not converted",
                                 hint="e.g. --target ort:cuda,fp16,fp32-nodes=NODE")

    def narrow(self) -> str | None:
        """fp16/bf16 when reprokit converts the model for the CUDA provider."""
        if not self.spec.has("cuda"):
            return None
        return next((p for p in ("fp16", "bf16") if self.spec.has(p)), None)

    def precision(self) -> str:
        if self.spec.has("trt"):
            return "fp16" if self.spec.has("fp16") else "tf32"
        if self.spec.has("cuda"):
            return self.narrow() or ("fp32" if self.spec.has("no-tf32") else "tf32")
        return "fp32"

    @classmethod
    def probe(cls) -> Availability:
        found = module_version("onnxruntime")
        if not found.available:
            return found
        import onnxruntime as ort

        providers = ort.get_available_providers()
        return Availability(True, found.version, f"providers: {', '.join(providers)}; {_gpu_targets(providers)}")

    def _providers(self):
        import onnxruntime as ort

        available = ort.get_available_providers()
        if self.spec.has("trt"):
            wanted = "TensorrtExecutionProvider"
            options = {"trt_fp16_enable": bool(self.spec.has("fp16"))}
            if wanted not in available:
                raise EngineUnavailable(
                    "onnxruntime's TensorRT execution provider is not available here "
                    f"(providers: {', '.join(available)})",
                    hint="pip install 'reprokit[gpu]' on a machine with CUDA and TensorRT",
                )
            return [(wanted, options), "CPUExecutionProvider"]
        if self.spec.has("cuda"):
            require_cuda_build(self.spec)
            return [cuda_provider(use_tf32=not self.spec.has("no-tf32")), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def run(self, model_path, feeds, output_names):
        providers = self._providers()
        meta = {"optimized": self.spec.has("opt")}
        with tempfile.TemporaryDirectory(prefix="reprokit-ort-") as tmp:
            optimize = self.spec.has("opt")
            try:
                if self.narrow():
                    keep = frozenset(n.strip() for n in str(self.spec.get("fp32-nodes", "")).split(";")
                                     if n.strip())
                    # the converted copies hold their weights (or have them beside them in tmp)
                    session = narrow_session(model_path, self.narrow(), keep, self.weights_dir, tmp, meta,
                                             lambda path: make_session(path, optimize=optimize,
                                                                       providers=providers))
                else:
                    optimized = os.path.join(tmp, "optimized.onnx") if optimize and _quantizes(model_path) else None
                    session = make_session(model_path, optimize=optimize, providers=providers,
                                           weights_dir=self.weights_dir, optimized_path=optimized)
                    if optimized and os.path.exists(optimized):  # a Q/DQ model: did int8 kernels run?
                        meta["int8_ops"] = _integer_kernels(optimized)
                if self.spec.has("cuda"):
                    refuse_cpu_fallback(session)  # before any run: a CPU run is never a GPU verdict
                    meta.update(gpu_meta(session))
                outputs = run_session(session, feeds, output_names)
            except Exception as exc:
                if self.spec.has("cuda") and not isinstance(exc, EngineUnavailable):
                    if environment_failure(str(exc)):  # a library or driver, not the model
                        raise environment_error(exc) from exc
                raise
        meta["providers"] = session.get_providers()
        return RunResult(outputs=outputs, meta=meta)
