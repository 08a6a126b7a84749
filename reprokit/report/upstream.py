"""Which upstream's issue form an archive's ISSUE.md follows, and the fields only that form asks
for: TensorRT's bug template for ``trt`` (and ``emulate``, which predicts TensorRT's fp16, and
``cmd``), OpenVINO's ``bug.yml`` for ``openvino``, onnxruntime's issue form for ``ort`` and
``ort:cuda``; with the command each project's maintainers run themselves (polygraphy,
``benchmark_app``, ``onnxruntime_perf_test``). Words only: reads the environment fingerprint and
the spec, runs nothing.
"""

from __future__ import annotations

ISSUE_TEMPLATES = {"openvino": "ISSUE-openvino.md.j2", "ort": "ISSUE-ort.md.j2"}
RELEASES = {"trt": "https://developer.nvidia.com/tensorrt",
            "openvino": "https://github.com/openvinotoolkit/openvino/releases",
            "ort": "https://github.com/microsoft/onnxruntime/releases"}
PACKAGES = {"openvino": "openvino", "ort": "onnxruntime"}


def issue_template(spec) -> str:
    return ISSUE_TEMPLATES.get(spec.engine, "ISSUE.md.j2")


def upstream_values(spec, env: dict) -> dict:
    """The values the engine's own template needs beyond the shared ones."""
    packages = env.get("packages") or {}
    os_words = env.get("os_release") or env.get("os") or "?"
    if spec.engine == "openvino":
        hint = next((h for h in ("bf16", "f16", "f32") if spec.has(h)), "bf16")
        version = packages.get("openvino")
        return {"ov_version": version or "not installed on the machine that made this archive",
                "ov_os": _openvino_os(os_words), "engine_command":
                f"benchmark_app -m model.onnx -d CPU -hint none -infer_precision {hint} -nireq 1 -niter 1",
                "latest_release": _latest("OpenVINO", "openvino", version)}
    if spec.engine == "ort":
        cuda = spec.has("cuda")
        build = env.get("onnxruntime_build") or {}
        version = packages.get("onnxruntime-gpu" if cuda and packages.get("onnxruntime-gpu") else "onnxruntime")
        system = (env.get("os") or "").split(" ")[0]
        ep_library = "-"
        if cuda:
            ep_library = "CUDA " + str(build.get("cuda_version") or env.get("cuda_runtime") or "?") + \
                         ", cuDNN " + str(build.get("cudnn_version") or env.get("cudnn") or "?")
        level = 99 if spec.has("opt") else 0
        return {"ort_platform": {"Linux": "Linux", "Windows": "Windows", "Darwin": "Mac"}.get(system, "Other / Unknown"),
                "ort_os": os_words, "ort_version": version or "?", "ort_installation": "Released Package",
                "ort_arch": {"x86_64": "X64", "AMD64": "X64", "aarch64": "ARM64", "arm64": "ARM64"}.get(
                    env.get("machine") or "", "Other / Unknown"),
                "ort_ep": "CUDA" if cuda else "Default CPU", "ort_ep_version": ep_library,
                "ort_optimization": "ORT_ENABLE_ALL" if spec.has("opt") else "ORT_DISABLE_ALL",
                "engine_command": _perf_test(spec, level),
                "latest_release": _latest("ONNX Runtime", "onnxruntime", version)}
    return {}


def _perf_test(spec, level: int) -> str:
    """onnxruntime_perf_test on the file the target ran (``cuda,fp16|bf16``: reprokit's converted
    model), TF32 off through NVIDIA_TF32_OVERRIDE=0 where the target turned it off."""
    cuda = spec.has("cuda")
    narrow = next((p for p in ("fp16", "bf16") if cuda and spec.has(p)), None)
    tf32 = "NVIDIA_TF32_OVERRIDE=0 " if cuda and spec.has("no-tf32") else ""
    model = f"model.{narrow}.onnx" if narrow else "model.onnx"
    return f"{tf32}onnxruntime_perf_test -e {'cuda' if cuda else 'cpu'} -o {level} -r 1 -I {model}"


def _latest(name: str, package: str, version: str | None) -> str:
    if not version:
        return f"Not run on {name} here. `reprokit verify ARCHIVE --versions '{package}==latest'` runs it on the newest release."
    return (f"Reproduced with {name} {version} (see above). Not yet tried with other releases: "
            f"`reprokit verify ARCHIVE --versions '{package}>={version}' --bisect` runs `repro.py` on each newer "
            "release in a fresh environment and names the first that fixes it.")


def _openvino_os(words: str) -> str:
    """bug.yml's dropdown: its own wording where one fits, else Other with the name."""
    for prefix, option in (("Ubuntu 18.04", "Ubuntu 18.04 (LTS)"), ("Ubuntu 20.04", "Ubuntu 20.04 (LTS)"),
                           ("Red Hat Enterprise Linux 8", "Red Hat Enterprise Linux 8"), ("Windows", "Windows System")):
        if words.startswith(prefix):
            return option
    return f"Other (Please specify in description): {words}"
