"""OpenVINO CPU backend with an inference precision hint (bf16, f16 or f32).

On CPUs with AVX512-BF16 OpenVINO's default CPU precision is bf16, so real models really diverge
here: a true optimizing engine with layer fusion, standing in for TensorRT on a machine with no GPU.
"""

from __future__ import annotations

from reprokit.backends.base import Availability, Backend, BuildError, RunResult, module_version
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.spec import OptionDoc, TargetSpec

_HINTS = {"bf16": "bf16", "f16": "f16", "f32": "f32"}


def cpu_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


class OpenVinoBackend(Backend):
    engine = "openvino"
    summary = "OpenVINO on the CPU with an inference precision hint (default bf16)"
    OPTIONS = {
        "bf16": OptionDoc("inference precision bf16 (needs a CPU with BF16 support; the default)"),
        "f16": OptionDoc("inference precision f16 (needs a CPU with FP16 support)"),
        "f32": OptionDoc("inference precision f32"),
    }
    deterministic = True
    install_hint = "pip install 'reprokit[openvino]'  (or: pip install openvino)"
    marking_changes_engine = True

    @classmethod
    def validate(cls, spec: TargetSpec) -> None:
        if sum(spec.has(h) for h in _HINTS) > 1:
            raise UsageError("openvino takes one precision: bf16, f16 or f32", hint="e.g. openvino:bf16")

    def hint(self) -> str:
        return next((h for h in _HINTS if self.spec.has(h)), "bf16")

    def precision(self) -> str:
        return {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}[self.hint()]

    @classmethod
    def probe(cls) -> Availability:
        found = module_version("openvino")
        if not found.available:
            return Availability(False, None, f"{found.detail}; install: {cls.install_hint}")
        caps = cpu_capabilities()
        return Availability(True, found.version, f"CPU capabilities: {', '.join(caps)}")

    def run(self, model_path, feeds, output_names):
        try:
            import openvino as ov
        except ImportError as exc:
            raise EngineUnavailable(f"OpenVINO is not installed: {exc}", hint=self.install_hint) from exc
        core = ov.Core()
        hint = self.hint()
        caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        wanted_cap = {"bf16": "BF16", "f16": "FP16", "f32": "FP32"}[hint]
        if wanted_cap not in caps:
            raise EngineUnavailable(
                f"this CPU cannot run OpenVINO in {hint} (OPTIMIZATION_CAPABILITIES: {', '.join(caps)}); "
                "OpenVINO would silently fall back to f32",
                hint="use --target openvino:f32, or emulate:bf16 / emulate:fp16 which work on any CPU",
            )
        try:
            model = core.read_model(model_path)
            compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses with its own text
            raise BuildError(f"OpenVINO could not compile the model: {exc}") from exc
        by_name = {}
        for port in compiled.outputs:
            for name in port.get_names():
                by_name[name] = port
        names = output_names or [p.get_any_name() for p in compiled.outputs]
        missing = [n for n in names if n not in by_name]
        if missing:
            raise BuildError(f"OpenVINO dropped outputs {missing[:5]} while compiling")
        try:
            request = compiled.create_infer_request()
            request.infer(feeds)
            outputs = {n: request.get_tensor(by_name[n]).data.copy() for n in names}
        except Exception as exc:
            raise BuildError(f"OpenVINO failed to run the model: {exc}") from exc
        actual = compiled.get_property("INFERENCE_PRECISION_HINT")
        name = actual.get_type_name() if hasattr(actual, "get_type_name") else str(actual)
        return RunResult(outputs=outputs, meta={"inference_precision": name, "device": "CPU"})
