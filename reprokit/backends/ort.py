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


def run_session(session, feeds, output_names):
    names = output_names or [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, feeds)
    except Exception as exc:
        raise BuildError(f"onnxruntime failed to run the model: {exc}") from exc
    return dict(zip(names, values))


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
