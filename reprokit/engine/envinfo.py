"""Environment fingerprint for reports: TensorRT, GPU, driver, CUDA, cuDNN, OS, container,
Python and package versions, CPU model, the onnxruntime build (CPU or GPU package, the CUDA/cuDNN
it was built for, its provider libraries). Tolerant of missing pieces: each is recorded as
missing, never a failure. Package versions come from installed metadata, so no engine is
imported.
"""

from __future__ import annotations

import getpass
import importlib.metadata as metadata
import os
import platform
import re
import shutil
import socket
import subprocess

PACKAGES = ["reprokit", "onnx", "onnxruntime", "onnxruntime-gpu", "onnx-graphsurgeon", "polygraphy",
            "numpy", "torch", "openvino", "ml-dtypes"]
TENSORRT_DISTRIBUTIONS = ["tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-cu11",
                          "tensorrt-rtx-cu13-bindings", "tensorrt-rtx-cu12-bindings", "tensorrt_rtx"]
MISSING = None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return MISSING


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpu_info() -> dict:
    """GPUs from nvidia-smi; an empty list when there is none or no driver."""
    text = _run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                 "--format=csv,noheader"])
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "compute_capability": parts[1], "driver": parts[2],
                         "memory": parts[3] if len(parts) > 3 else None})
    cuda = None
    header = _run(["nvidia-smi"])
    if header and "CUDA Version:" in header:
        cuda = header.split("CUDA Version:")[1].split()[0]
    return {"gpus": gpus, "cuda_driver_api": cuda}


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def container() -> str:
    if os.path.exists("/.dockerenv"):
        return "container (docker)"
    try:
        with open("/proc/1/cgroup") as handle:
            text = handle.read()
        if any(key in text for key in ("docker", "kubepods", "containerd", "lxc")):
            return "container"
    except OSError:
        pass
    if os.environ.get("container"):
        return f"container ({os.environ['container']})"
    return "bare metal (no container detected)"


def tensorrt_version() -> dict:
    for name in TENSORRT_DISTRIBUTIONS:
        version = _version(name)
        if version:
            return {"distribution": name, "version": version}
    return {"distribution": None, "version": MISSING}


def onnxruntime_build() -> dict:
    """package, version and (GPU builds) the CUDA/cuDNN versions onnxruntime was built for, read
    from its ``capi/build_and_package_info.py`` as text, and the provider libraries it ships
    (``cuda``, ``tensorrt``): nothing is imported. Empty without onnxruntime."""
    import importlib.util

    try:
        found = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        return {}
    path = os.path.join(os.path.dirname(found.origin), "capi", "build_and_package_info.py")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return {}
    keys = {"package_name": "package", "__version__": "version", "cuda_version": "cuda_version",
            "cudnn_version": "cudnn_version"}
    info = {}
    for key, name in keys.items():
        match = re.search(rf"^{re.escape(key)}\s*=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE)
        if match:
            info[name] = match.group(1)
    try:
        libraries = os.listdir(os.path.dirname(path))
    except OSError:
        libraries = []
    prefix = "libonnxruntime_providers_"
    info["provider_libraries"] = sorted(n[len(prefix):].split(".")[0] for n in libraries
                                        if n.startswith(prefix) and not n.startswith(prefix + "shared"))
    return info


def fingerprint() -> dict:
    """Everything a bug report's Environment section needs. Never raises."""
    gpu = gpu_info()
    libc = platform.libc_ver()
    return {
        "schema": "reprokit.env/1",
        "tensorrt": tensorrt_version(),
        "gpu": gpu["gpus"] or MISSING,
        "cuda_driver_api": gpu["cuda_driver_api"],
        "cuda_runtime": _version("nvidia-cuda-runtime-cu12") or _version("nvidia-cuda-runtime-cu13")
        or _version("nvidia-cuda-runtime"),
        "cudnn": _version("nvidia-cudnn-cu12") or _version("nvidia-cudnn-cu13"),
        "cublas": _version("nvidia-cublas-cu12") or _version("nvidia-cublas"),
        "onnxruntime_build": onnxruntime_build() or MISSING,
        "os": f"{platform.system()} {platform.release()}",
        "os_release": _os_release(),
        "kernel": platform.version(),
        "libc": f"{libc[0]} {libc[1]}".strip() or None,
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "container": container(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "hostname": socket.gethostname(),
        "user": _user(),
        "cwd": os.getcwd(),
    }


def _os_release() -> str | None:
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return None


PRIVATE_KEYS = ("hostname", "user", "cwd")


def redact(env: dict) -> dict:
    """Drop hostnames, user names and paths."""
    return {k: ("<redacted>" if k in PRIVATE_KEYS else v) for k, v in env.items()}
