"""onnxruntime backend: the default reference (CPU, fp32, graph optimizations off).

``ort:opt`` turns ORT's graph optimizations on (a CPU target with real fusions);
``ort:cuda`` and ``ort:trt[,fp16]`` need onnxruntime-gpu.
"""

from __future__ import annotations

import os

from reprokit.backends.base import Availability, Backend, BuildError, RunResult, module_version
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.spec import OptionDoc, TargetSpec


def make_session(model_path: str, *, optimize: bool = False, providers=None, threads: int = 0,
                 weights_dir: str | None = None):
    """An InferenceSession on a model file; parse/load failures become BuildError."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    # Warnings too (an optimizer that cannot apply a rewrite): this runs in a worker process whose
    # output is the run's engine log, never the console (reprokit.enginelog).
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


class OrtBackend(Backend):
    engine = "ort"
    summary = "onnxruntime, CPU fp32, graph optimizations off (the default reference)"
    OPTIONS = {
        "opt": OptionDoc("enable all ORT graph optimizations (fusions) instead of none"),
        "cuda": OptionDoc("CUDA execution provider (needs onnxruntime-gpu and a GPU)"),
        "trt": OptionDoc("TensorRT execution provider (needs onnxruntime-gpu with TensorRT)"),
        "fp16": OptionDoc("with trt: enable FP16 in the TensorRT execution provider"),
    }
    deterministic = True
    reads_weights_dir = True
    install_hint = "pip install onnxruntime  (GPU providers: pip install 'reprokit[gpu]')"

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        if spec.has("fp16") and not spec.has("trt"):
            raise UsageError("ort:fp16 needs the trt provider", hint="use --target ort:trt,fp16")

    def precision(self) -> str:
        if self.spec.has("trt"):
            return "fp16" if self.spec.has("fp16") else "tf32"
        if self.spec.has("cuda"):
            return "tf32"
        return "fp32"

    @classmethod
    def probe(cls) -> Availability:
        found = module_version("onnxruntime")
        if not found.available:
            return found
        import onnxruntime as ort

        providers = ort.get_available_providers()
        return Availability(True, found.version, f"providers: {', '.join(providers)}")

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
            if "CUDAExecutionProvider" not in available:
                raise EngineUnavailable(
                    "onnxruntime's CUDA execution provider is not available here "
                    f"(providers: {', '.join(available)})",
                    hint="pip install 'reprokit[gpu]' on a machine with an NVIDIA GPU",
                )
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def run(self, model_path, feeds, output_names):
        session = make_session(
            model_path, optimize=self.spec.has("opt"), providers=self._providers(),
            weights_dir=self.weights_dir,
        )
        return RunResult(
            outputs=run_session(session, feeds, output_names),
            meta={"providers": session.get_providers(), "optimized": self.spec.has("opt")},
        )
