"""Words for reports: the issue title and description written from a verdict, the Environment
lines of the TensorRT bug template, and the equivalent polygraphy and trtexec commands.
"""

from __future__ import annotations

import shlex

from reprokit.engine.backends.trt_setup import has_qdq
from reprokit.engine.oracle import Kind
from reprokit.errors import ReprokitError
from reprokit.report.trtcommands import trt_forms
from reprokit.spec import parse_target

FP16_MAX = 65504.0
_ENGINE_NAMES = {"ort": "ONNX Runtime", "emulate": "fp16/bf16 storage emulation (reprokit)",
                 "openvino": "OpenVINO (CPU)", "trt": "TensorRT", "cmd": "the check command"}


def engine_label(spec, env) -> str:
    if spec.engine == "trt":
        version = env["tensorrt"]["version"]
        name = "TensorRT-RTX" if "rtx" in (env["tensorrt"].get("distribution") or "") else "TensorRT"
        return f"{name} {version}" if version else name
    if spec.engine == "openvino":
        return f"OpenVINO {env['packages'].get('openvino') or ''} CPU".replace("  ", " ")
    if spec.engine == "ort":  # the onnxruntime that was imported (onnxruntime-gpu is another package)
        build = env.get("onnxruntime_build") if isinstance(env.get("onnxruntime_build"), dict) else {}
        packages = env.get("packages", {})
        version = build.get("version") or packages.get("onnxruntime") or packages.get("onnxruntime-gpu") or ""
        package = build.get("package") or ""
        suffix = f" ({package})" if package and package != "onnxruntime" else ""
        return f"ONNX Runtime {version}".strip() + suffix
    if spec.engine == "emulate" and spec.has("typed"):
        return "reprokit's storage emulator of the model's own fp16/bf16 tensors"
    if spec.engine == "emulate":
        return f"reprokit's {'fp16' if spec.has('fp16') else 'bf16'} storage emulator"
    return _ENGINE_NAMES[spec.engine]


def reference_parts(reference: str) -> tuple[str, str]:
    """The reference engine's name and its setting (device, precision), worded from the archive's
    own reference spec: an archive checked against OpenVINO must not say ONNX Runtime."""
    try:
        spec = parse_target(reference)
    except ReprokitError:  # a spec this reprokit does not know: quote it, claim nothing
        return "the reference", f"`{reference}`"
    if spec.engine == "ort":
        device = "CUDA" if spec.has("cuda") else "TensorRT execution provider" if spec.has("trt") else "CPU"
        precision = "fp16" if spec.has("fp16") else "bf16" if spec.has("bf16") else "fp32"
        return "ONNX Runtime", f"{device}, {precision}" + (", all graph optimizations" if spec.has("opt") else "")
    if spec.engine == "openvino":  # bf16 is OpenVINO's own default hint (engine/backends/openvino.py)
        return "OpenVINO", "CPU, " + next((p for p in ("f32", "f16", "bf16") if spec.has(p)), "bf16")
    if spec.engine == "cmd":
        return "the check command", f"`{spec.command}`"
    if spec.engine == "emulate":
        return "reprokit's storage emulator", "bf16" if spec.has("bf16") else "fp16"
    return _ENGINE_NAMES[spec.engine], f"`{spec}`"


def reference_words(reference: str) -> str:
    """E.g. "ONNX Runtime (CPU, fp32)", "OpenVINO (CPU, f32)"."""
    name, setting = reference_parts(reference)
    return f"{name} ({setting})"


def title(verdict, spec, env, ops) -> str:
    """"XXX failure of TensorRT X.Y when running XXX on GPU XXX", as the template asks."""
    what = {
        Kind.NONFINITE: f"{_nonfinite_words(verdict.signature.detail)} output",
        Kind.MISMATCH: "Accuracy",
        Kind.BUILD_ERROR: "Build",
        Kind.CRASH: "Crash",
        Kind.TIMEOUT: "Hang",
    }.get(verdict.kind, "Divergence")
    gpus = env.get("gpu") or []
    device = f"GPU {gpus[0]['name']}" if gpus else f"CPU {env.get('cpu') or 'unknown'}"
    numeric = verdict.kind in (Kind.NONFINITE, Kind.MISMATCH) and spec.engine != "emulate"
    precision = f" {verdict.precision.upper()}" if numeric else ""
    return (f"{what} failure of {engine_label(spec, env)}{precision} (`{spec}`) when running "
            f"{', '.join(ops[:4])}{' …' if len(ops) > 4 else ''} on {device}")


def describe(verdict, spec, model, context, steps: dict | None = None) -> str:
    """ISSUE.md's description. ``steps``: a quantized model's outputs judged in quantization steps
    (verdict.json's ``quant_steps.steps``), whose error reads in steps, not in the metric."""
    nodes = list(model.graph.node)
    ops = ", ".join(f"`{n.op_type}`" + (f" (`{n.name}`)" if n.name else "") for n in nodes[:6])
    more = f" and {len(nodes) - 6} more" if len(nodes) > 6 else ""
    inputs = ", ".join(f"`{i.name}` {_shape(i)}" for i in model.graph.input)
    engine = f"`{spec}`"
    worst = verdict.worst()
    outputs = ", ".join(f"`{o}`" for o in verdict.signature.outputs[:4])
    if verdict.kind is Kind.NONFINITE:
        sentence = (f"With {engine} the model produces {_nonfinite_words(verdict.signature.detail)} in {outputs}, "
                    f"where {reference_words(verdict.reference)} gives finite values.")
    elif verdict.kind is Kind.MISMATCH and worst is not None and (steps or {}).get(worst.name):
        sentence = (f"With {engine} the output {outputs} differs from {reference_words(verdict.reference)} by "
                    f"{worst.error:.3g} quantization steps of {steps[worst.name]:.3g} (max abs error "
                    f"{worst.max_abs:.3g}, rel-l2 {worst.rel_l2:.3g}), where one step is int8 rounding and more "
                    "diverges.")
    elif verdict.kind is Kind.MISMATCH and worst is not None:
        sentence = (f"With {engine} the output {outputs} differs from {reference_words(verdict.reference)}: "
                    f"{verdict.criterion.metric.value} error {worst.error:.3g} against a tolerance of "
                    f"{verdict.criterion.tolerance:g} (max abs error {worst.max_abs:.3g}).")
    elif verdict.kind is Kind.BUILD_ERROR:
        sentence = f"{engine} refuses the model: `{_key_line(verdict.message) or verdict.signature.detail}`."
    elif verdict.kind is Kind.CRASH:
        sentence = f"{engine} crashes ({verdict.signature.detail}) on the model."
    else:
        sentence = f"{engine} does not finish on the model ({verdict.signature.detail})."
    parts = [sentence, f"The model is {len(nodes)} node{'s' if len(nodes) != 1 else ''}: {ops}{more}; inputs {inputs}."]
    original = (context or {}).get("original_signature")
    if original and (original.get("detail"), original.get("outputs")) != (verdict.signature.detail, list(verdict.signature.outputs)):
        where = ", ".join(f"`{o}`" for o in original.get("outputs", [])[:3])
        shown = _nonfinite_words(original["detail"]) if original["kind"] == "nonfinite" else original["kind"]
        parts.append(f"In the original {context['original_nodes']}-node model it shows as {shown}"
                     + (f" in {where}" if where else "") + ".")
    big = max((o.max_abs_reference for o in verdict.outputs), default=0.0)
    if verdict.precision == "fp16" and big > FP16_MAX:
        parts.append(f"The reference values reach {big:.4g}, beyond the fp16 maximum {FP16_MAX:g}: "
                     "stored in fp16 they overflow to inf.")
    if spec.engine == "emulate" and spec.has("typed"):
        parts.append("Found with reprokit's storage emulator on the model as typed (the tensors it declares fp16/bf16 "
                     "stored narrow, the rest fp32, arithmetic in fp32, as TensorRT's FP16 kernels do) on a machine "
                     "without a GPU; `commands.sh` has the TensorRT command that builds the converted model strongly "
                     "typed on a GPU.")
    elif spec.engine == "emulate":
        parts.append("Found with reprokit's storage emulator (every tensor stored in fp16/bf16, arithmetic in "
                     "fp32, as TensorRT's FP16 kernels do) on a machine without a GPU; `commands.sh` has the "
                     "TensorRT command that checks the same thing on a GPU.")
    notes = [n for n in verdict.target_meta.get("notes") or [] if isinstance(n, str)]
    if notes:  # what changed what ran (a calibration, a conversion's limits): said, never hidden
        parts.append("Noted by the engine run: " + "; ".join(notes) + ".")
    if verdict.target_meta.get("mode"):
        parts.append(f"TensorRT was driven {verdict.target_meta['mode']}"
                     + (f" with builder flags {', '.join(verdict.target_meta.get('builder_flags', []))}." if verdict.target_meta.get("builder_flags") else "."))
    return " ".join(parts)


def _key_line(message: str) -> str:
    """The engine's most telling line: an UNSUPPORTED_NODE line, else the first error line."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    for pattern in ("UNSUPPORTED_NODE", "ERROR", "Error", "error"):
        for line in lines:
            if pattern in line:
                return line.split("could not build or run the model: ")[-1][:300]
    return lines[0][:300] if lines else ""


def _nonfinite_words(detail: str) -> str:
    return {"nan": "NaN", "inf": "Inf", "nan+inf": "NaN and Inf"}.get(detail, "non-finite values")


def _shape(vi) -> str:
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]
    return "[" + ",".join(dims) + "]"


def environment_lines(env, meta: dict | None = None) -> dict[str, str]:
    """The TensorRT template's Environment lines; ``meta`` (the verdict's target_meta) gives the
    CUDA runtime and cuDNN the target's process loaded, which beat installed packages' versions."""
    missing = "not available on the machine that made this archive"
    meta = meta or {}
    loaded = {key: meta.get(key) for key in ("cuda_runtime_loaded", "cudnn_loaded")}
    gpus = env.get("gpu") or []
    gpu = "; ".join(f"{g['name']} (compute capability {g['compute_capability']})" for g in gpus)
    packages = env.get("packages", {})
    others = ", ".join(f"{k} {v}" for k, v in packages.items() if v and k not in ("torch",))
    return {
        "tensorrt": env["tensorrt"]["version"] or f"{missing} (not installed)",
        "gpu": gpu or f"none ({env.get('cpu') or 'CPU'}; {missing})",
        "driver": gpus[0]["driver"] if gpus else missing,
        "cuda": (f"{loaded['cuda_runtime_loaded']} (the runtime the target loaded)" if loaded["cuda_runtime_loaded"]
                 else env.get("cuda_runtime") or env.get("cuda_driver_api") or missing),
        "cudnn": (f"{loaded['cudnn_loaded']} (the library the target loaded)" if loaded["cudnn_loaded"]
                  else env.get("cudnn") or missing),
        "os": f"{env.get('os_release') or env.get('os')} ({env.get('os')}, {env.get('machine')})",
        "python": env.get("python") or "?",
        "torch": packages.get("torch") or "not installed",
        "container": env.get("container") or "?",
        "other": others,
    }


def polygraphy_command(spec, verdict, model) -> str:
    """polygraphy's own comparison of the target against ONNX Runtime on the bundled inputs."""
    if spec.engine in ("trt", "emulate"):  # the form reprokit built (both are in commands.sh)
        return primary_form(trt_forms_for(spec, verdict, model, {})).polygraphy
    if spec.engine == "ort" and spec.has("cuda"):
        return ort_cuda_command(spec, verdict.criterion)
    if spec.engine == "ort":
        return shlex.join(["polygraphy", "run", "model.onnx", "--onnxrt", "--load-inputs", "inputs.json"])
    if spec.engine == "cmd":  # the check itself, on the bundled files: no placeholder left to fill in
        names = {"{model}": "model.onnx", "{inputs}": "inputs.npz", "{outputs}": "outputs.npz"}
        argv = shlex.split(spec.command)
        for key, value in names.items():
            argv = [token.replace(key, value) for token in argv]
        return shlex.join(argv)
    return ""  # no polygraphy runner for this engine (polygraphy_note says so)


def polygraphy_note(spec) -> str:
    """commands.sh's words for a polygraphy line that compares nothing ("" where it compares):
    polygraphy sets no onnxruntime optimization level and has no OpenVINO runner."""
    if spec.engine == "ort" and not spec.has("cuda"):
        return ("polygraphy's ONNX Runtime runner on the same inputs: one run at polygraphy's own graph "
                "optimization level (it sets none), compared with nothing; repro.py above is the comparison.")
    if spec.engine not in ("trt", "emulate", "ort", "cmd"):
        return "(polygraphy has no runner for this engine: repro.py above is the comparison.)"
    return ""


def ort_cuda_file(spec) -> str:
    """The file an ``ort:cuda`` target ran: ``model.fp16.onnx``/``model.bf16.onnx`` converted by
    reprokit for ``cuda,fp16|bf16``, else ``model.onnx``."""
    narrow = next((p for p in ("fp16", "bf16") if spec.has(p)), None)
    return f"model.{narrow}.onnx" if narrow else "model.onnx"


def ort_cuda_command(spec, criterion) -> str:
    """polygraphy's comparison of an ``ort:cuda`` target with onnxruntime on the CPU: one runner
    per run (its ONNX Runtime runner takes one provider list), so the first saves the CPU outputs
    of ``model.onnx`` and the second runs the file the target ran on CUDA and compares. TF32 off
    (``no-tf32``) is NVIDIA_TF32_OVERRIDE=0: polygraphy passes no provider options."""
    tf32 = ["NVIDIA_TF32_OVERRIDE=0"] if spec.has("no-tf32") else []
    saved = "reference_outputs.json"
    first = ["polygraphy", "run", "model.onnx", "--onnxrt", "--load-inputs", "inputs.json", "--save-outputs", saved]
    second = [*tf32, "polygraphy", "run", ort_cuda_file(spec), "--onnxrt", "--providers", "cuda", "--load-inputs",
              "inputs.json", "--load-outputs", saved, "--atol", f"{criterion.atol:g}", "--rtol", f"{criterion.rtol:g}",
              "--check-error-stat", "mean"]
    return shlex.join(first) + " && " + shlex.join(second)


def trt_forms_for(spec, verdict, model, bins: dict[str, str], env: dict | None = None):
    """Both TensorRT forms (weakly and strongly typed) of a trt/emulate archive's model."""
    return trt_forms(spec, verdict.criterion, bins, built_typing=verdict.target_meta.get("mode"),
                     qdq=has_qdq(model), env=env, pinned=verdict.target_meta.get("fp32_layers"))


def primary_form(forms):
    """The form reprokit built; for emulate (no TensorRT ran) the weakly typed one, the builder
    flag its users set; never a form that cannot build the reported precision."""
    weak, strong = forms
    first, second = (strong, weak) if strong.built else (weak, strong)
    return first if first.polygraphy else second


def trtexec_command(spec, bins: dict[str, str]) -> str:
    """trtexec on model.onnx (fp32, TF32 as TensorRT's default) for an archive of another engine:
    a trt/emulate archive prints both TensorRT forms instead (:mod:`.trtcommands`), a
    ``--reference-model`` one :mod:`.twincommands`' line."""
    loads = ",".join(f"{name}:{path}" for name, path in bins.items())
    return shlex.join(["trtexec", "--onnx=model.onnx", *([f"--loadInputs={loads}"] if loads else []),
                       "--dumpOutput", "--verbose"])
