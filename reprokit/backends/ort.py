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
    options.log_severity_level = 3
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


# numpy dtypes onnxruntime's Python API cannot take or give (ml_dtypes): they travel as raw bits
# in OrtValues typed by their ONNX element type.
_RAW = {"bfloat16": ("BFLOAT16", "uint16"), "float8_e4m3fn": ("FLOAT8E4M3FN", "uint8"),
        "float8_e4m3fnuz": ("FLOAT8E4M3FNUZ", "uint8"), "float8_e5m2": ("FLOAT8E5M2", "uint8"),
        "float8_e5m2fnuz": ("FLOAT8E5M2FNUZ", "uint8"), "int4": ("INT4", "uint8"), "uint4": ("UINT4", "uint8"),
        "int2": ("INT2", "uint8"), "uint2": ("UINT2", "uint8")}
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "INT2": 2, "UINT2": 2}  # several values per byte in ONNX


_NARROW_OUTPUTS = {"tensor(bfloat16)", "tensor(float8e4m3fn)", "tensor(float8e4m3fnuz)", "tensor(float8e5m2)",
                   "tensor(float8e5m2fnuz)", "tensor(int4)", "tensor(uint4)", "tensor(int2)", "tensor(uint2)"}


def run_session(session, feeds, output_names):
    names = output_names or [o.name for o in session.get_outputs()]
    narrow_out = {o.name for o in session.get_outputs() if o.type in _NARROW_OUTPUTS}
    try:
        if any(str(getattr(v, "dtype", "")) in _RAW for v in feeds.values()) or narrow_out & set(names):
            return dict(zip(names, _run_raw(session, names, feeds)))
        values = session.run(names, feeds)
    except Exception as exc:
        raise BuildError(f"onnxruntime failed to run the model: {exc}") from exc
    return dict(zip(names, values))


def _run_raw(session, names, feeds):
    """Run with OrtValues so bfloat16/float8/int4 feeds reach the model as themselves, and read
    outputs of those types back as raw bits viewed through ml_dtypes."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto

    values = {}
    for name, value in feeds.items():
        array = np.ascontiguousarray(value)
        raw = _RAW.get(str(array.dtype))
        if raw is None:
            values[name] = ort.OrtValue.ortvalue_from_numpy(array)
        elif raw[0] in _PACKED_BITS:  # several per byte in ONNX: copied in packed, as ONNX stores them
            import ctypes

            from onnx import numpy_helper

            bits = np.frombuffer(numpy_helper.from_array(array, name).raw_data, np.uint8)
            values[name] = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), getattr(TensorProto, raw[0]))
            ctypes.memmove(values[name].data_ptr(), bits.ctypes.data, bits.nbytes)
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(raw[1]),
                                                                            getattr(TensorProto, raw[0]))
    return [_to_numpy(v) for v in session.run_with_ort_values(names, values)]


def _to_numpy(value):
    import ctypes

    import numpy as np

    element = value.data_type()[len("tensor("):-1] if value.data_type().startswith("tensor(") else ""
    kind = {"bfloat16": "bfloat16", "float8e4m3fn": "float8_e4m3fn", "float8e4m3fnuz": "float8_e4m3fnuz",
            "float8e5m2": "float8_e5m2", "float8e5m2fnuz": "float8_e5m2fnuz", "int4": "int4",
            "uint4": "uint4", "int2": "int2", "uint2": "uint2"}.get(element)
    if kind is None:
        return value.numpy()
    import ml_dtypes

    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    bits = _PACKED_BITS.get(kind.upper())
    if bits:  # several values per byte, lowest bits first
        per = 8 // bits
        packed = np.ctypeslib.as_array((ctypes.c_uint8 * ((count + per - 1) // per)).from_address(value.data_ptr())).copy()
        mask = (1 << bits) - 1
        values = np.stack([(packed >> (bits * k)) & mask for k in range(per)], axis=-1).reshape(-1)[:count]
        values = values.astype(np.int8)
        if kind.startswith("int"):  # two's complement
            values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
        return values.reshape(shape).astype(getattr(ml_dtypes, kind))
    width = ctypes.c_uint16 if kind == "bfloat16" else ctypes.c_uint8
    bits = np.ctypeslib.as_array((width * count).from_address(value.data_ptr())).copy() if count else \
        np.zeros(0, np.uint16 if kind == "bfloat16" else np.uint8)
    return bits.reshape(shape).view(getattr(ml_dtypes, kind))


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
