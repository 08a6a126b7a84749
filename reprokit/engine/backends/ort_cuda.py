"""The CUDA side of the ``ort`` engine: ``ort:cuda`` (TF32, as onnxruntime's default),
``ort:cuda,no-tf32`` and ``ort:cuda,fp16|bf16`` (the model converted by
:mod:`reprokit.convert`, float32 graph I/O, ``fp32-nodes`` kept in float32 between Casts).

onnxruntime falls back to the CPU without an error when the CUDA provider cannot load (a
missing libcudart, cuBLAS or cuDNN): :func:`refuse_cpu_fallback` reads the session's providers
and makes that an environment error (exit 4) naming what is missing, so a CPU run is never
reported as a GPU verdict. :func:`gpu_meta` records what the run used (provider and its options,
GPU, compute capability, driver, CUDA/cuDNN of the onnxruntime build and the libraries loaded).

Runs inside a worker process; imports onnxruntime inside functions only.
"""

from __future__ import annotations

import os
import sys

from reprokit.convert import convert_float_model_report
from reprokit.engine.backends.base import BuildError
from reprokit.engine.backends.trt_setup import no_gpu_hint, nvidia_driver_present
from reprokit.engine.envinfo import gpu_info, onnxruntime_build
from reprokit.errors import EngineUnavailable, InputError
from reprokit.files import read_json
from reprokit.graph.model import name_unnamed_nodes

CUDA = "CUDAExecutionProvider"
INSTALL_HINT = ("pip uninstall onnxruntime && pip install 'reprokit[gpu]' (onnxruntime-gpu; the two packages "
                "clash) on a machine with an NVIDIA GPU and its driver, plus the CUDA and cuDNN libraries "
                "onnxruntime-gpu names (pip install 'onnxruntime-gpu[cuda,cudnn]'); see docs/gpu.md")


def cuda_provider(use_tf32: bool) -> tuple[str, dict]:
    """The CUDA provider entry; ``use_tf32`` is onnxruntime's own CUDA provider option."""
    return CUDA, {"use_tf32": "1" if use_tf32 else "0"}


def require_cuda_build(spec=None) -> None:
    """EngineUnavailable (exit 4) when this onnxruntime has no CUDA provider at all; on a machine
    without an NVIDIA driver it says so (installing onnxruntime-gpu would not help) and the hint
    names what runs here for ``spec``'s precision, as for TensorRT."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if CUDA not in available:
        build = onnxruntime_build()
        no_gpu, hint = "", INSTALL_HINT
        if not nvidia_driver_present():
            no_gpu = ("; and this machine has no NVIDIA GPU driver (no /proc/driver/nvidia, no nvidia-smi): the "
                      "CUDA provider cannot run here, installed or not")
            hint += no_gpu_hint(spec, "onnxruntime-gpu")
        raise EngineUnavailable(
            f"onnxruntime-gpu is not installed here: {build.get('package') or 'onnxruntime'} "
            f"{build.get('version') or ort.__version__} has no CUDA execution provider "
            f"(providers: {', '.join(available)}){no_gpu}",
            hint=hint,
        )


def refuse_cpu_fallback(session, wanted: str = CUDA) -> None:
    """EngineUnavailable (exit 4) when the session does not run on ``wanted``: onnxruntime drops
    a provider that cannot load (or that this build lacks) with a warning and runs on the CPU."""
    got = list(session.get_providers())
    if wanted in got:
        missing = cuda_library_error() if wanted == CUDA else None
        if missing and missing.startswith("cuDNN"):  # loads without it, fails on its first cuDNN kernel
            raise environment_error(RuntimeError(missing))
        return
    reason = cuda_library_error() if wanted == CUDA else None
    build = onnxruntime_build()
    needs = " and ".join(f"{label} {build[key]}" for key, label in (("cuda_version", "CUDA"), ("cudnn_version", "cuDNN"))
                         if build.get(key))
    raise EngineUnavailable(
        f"onnxruntime's {wanted} did not load, so the session would run on {', '.join(got)}: "
        f"{reason or 'onnxruntime dropped it (its own message is in the engine log)'}; "
        "a CPU run is not reported as a GPU verdict",
        hint=(f"this onnxruntime was built for {needs}; " if needs else "")
        + "install the missing libraries (e.g. pip install 'onnxruntime-gpu[cuda,cudnn]', or the "
          "CUDA toolkit and cuDNN on LD_LIBRARY_PATH) and check with `reprokit backends`",
    )


def cuda_library_error() -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, in the dynamic loader's words
    (``libcublas.so.13: cannot open shared object file``), or None when it can.

    The provider library and cuDNN are loaded the way onnxruntime will: first as the process
    finds them (LD_LIBRARY_PATH, the system), then once more after ``onnxruntime.preload_dlls()``,
    which loads the CUDA and cuDNN libraries of the ``nvidia-*`` pip packages
    (``pip install 'onnxruntime-gpu[cuda,cudnn]'``). cuDNN is not a link-time dependency of the
    provider: without it the session loads and fails on its first cuDNN kernel, so it is checked
    here rather than read from the session's providers."""
    if not sys.platform.startswith("linux"):
        return None
    missing = _library_error()
    if missing is None:
        return None
    if _preload():
        missing = _library_error()
    return missing


def _library_error() -> str | None:
    import ctypes

    import onnxruntime

    capi = os.path.join(os.path.dirname(os.path.abspath(onnxruntime.__file__)), "capi")
    library = os.path.join(capi, "libonnxruntime_providers_cuda.so")
    if not os.path.exists(library):
        return "libonnxruntime_providers_cuda.so is not part of this onnxruntime build (a CPU-only package)"
    try:
        shared = os.path.join(capi, "libonnxruntime_providers_shared.so")
        if os.path.exists(shared):
            ctypes.CDLL(shared, mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(library)
    except OSError as exc:
        return str(exc)
    try:
        ctypes.CDLL(cudnn_soname())
    except OSError as exc:
        return f"cuDNN: {exc}"
    return None


def cudnn_soname() -> str:
    """The cuDNN library this onnxruntime build loads (libcudnn.so.9 for cuDNN 9)."""
    major = str(onnxruntime_build().get("cudnn_version") or "9").split(".")[0]
    return f"libcudnn.so.{major if major.isdigit() else 9}"


def _preload() -> bool:
    """onnxruntime.preload_dlls() (onnxruntime-gpu ≥ 1.21), its prints kept off stdout; True when
    it ran."""
    import contextlib

    import onnxruntime

    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is None:
        return False
    try:
        with contextlib.redirect_stdout(sys.stderr):
            preload()
    except Exception:  # noqa: BLE001 - a failed preload leaves the loader's own error to report
        return False
    return True


# Messages of onnxruntime/CUDA that mean the machine cannot run CUDA kernels at all (a library
# that does not load, no driver or GPU): exit 4, never a verdict about the model.
_ENVIRONMENT_FAILURES = (
    "cannot open shared object file", "failed to load library", "cudnn_status_not_initialized",
    "cuda driver version is insufficient", "no cuda-capable device", "cudaerrornodevice",
    "cudaerrorinsufficientdriver", "cuda_error_no_device", "unable to dlopen",
)


def environment_failure(message: str) -> bool:
    """True when an error of a CUDA session says the CUDA environment is broken, not the model."""
    lowered = message.lower()
    return any(marker in lowered for marker in _ENVIRONMENT_FAILURES)


def environment_error(exc: BaseException) -> EngineUnavailable:
    """The exit-4 error for a CUDA session that failed because of the environment."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EngineUnavailable(
        f"onnxruntime's CUDA provider cannot run here: {first[:400]}; a CPU run is not reported as a GPU verdict",
        hint="install the missing libraries (e.g. pip install 'onnxruntime-gpu[cuda,cudnn]', or the CUDA toolkit "
             "and cuDNN on LD_LIBRARY_PATH) and check with `reprokit backends`",
    )


def _loaded_version(sonames: tuple[str, ...], symbol: str, by_pointer: bool) -> str | None:
    """The version of a CUDA library this process has already loaded (never loads one)."""
    import ctypes

    for soname in sonames:
        try:
            library = ctypes.CDLL(soname, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_GLOBAL)
            function = getattr(library, symbol)
            if by_pointer:
                value = ctypes.c_int(0)
                if function(ctypes.byref(value)) != 0:
                    continue
                number = value.value
            else:
                function.restype = ctypes.c_size_t
                number = function()
        except (OSError, AttributeError):
            continue
        if by_pointer:  # cudaRuntimeGetVersion: 1000·major + 10·minor
            return f"{number // 1000}.{number % 1000 // 10}"
        major = number // 10000 if number >= 10000 else number // 1000  # cuDNN 9: 90100; 8: 8902
        rest = number % 10000 if number >= 10000 else number % 1000
        return f"{major}.{rest // 100}.{rest % 100}"
    return None


def gpu_meta(session, device_id: int = 0) -> dict:
    """What a CUDA run used: provider and options, GPU, compute capability, driver, CUDA/cuDNN
    (the onnxruntime build's and the loaded libraries'). Missing pieces are None, never errors."""
    import onnxruntime as ort

    options = session.get_provider_options().get(CUDA, {})
    try:
        device_id = int(options.get("device_id", device_id))
    except (TypeError, ValueError):
        pass
    meta = {
        "provider": session.get_providers()[0],
        "provider_options": {k: options[k] for k in sorted(options)},
        "tf32": options.get("use_tf32", "1") not in ("0", "false", "False"),
        "onnxruntime_device": ort.get_device(),
        "onnxruntime_build": onnxruntime_build(),
        "cuda_runtime_loaded": _loaded_version(("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                                "libcudart.so"), "cudaRuntimeGetVersion", True),
        "cudnn_loaded": _loaded_version(("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"), "cudnnGetVersion", False),
    }
    found = gpu_info()
    gpus = found["gpus"]
    gpu = gpus[device_id] if device_id < len(gpus) else (gpus[0] if gpus else None)
    meta.update(gpu=gpu, cuda_driver_api=found["cuda_driver_api"], gpu_source="nvidia-smi" if gpu else None)
    if gpu is None:
        meta.update(_torch_gpu(device_id))
    return meta


def _torch_gpu(device_id: int) -> dict:
    """GPU facts from torch.cuda when nvidia-smi gave none and torch is installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return {}
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        major, minor = torch.cuda.get_device_capability(device_id)
        cudnn = torch.backends.cudnn.version()
        return {"gpu": {"name": torch.cuda.get_device_name(device_id), "compute_capability": f"{major}.{minor}",
                        "driver": None, "memory": None},
                "gpu_source": "torch.cuda", "torch_cuda": torch.version.cuda, "torch_cudnn": cudnn}
    except Exception:  # a broken CUDA setup in torch says nothing about onnxruntime's
        return {}


def convert_for_cuda(model_path: str, narrow: str, keep: frozenset[str], weights_dir: str | None,
                     tmp: str, meta: dict) -> str:
    """The model converted to ``narrow`` (float32 graph I/O) in ``tmp``; returns its path."""
    meta.update(fp32_nodes=sorted(keep))
    return _convert(_load_source(model_path, weights_dir, bool(keep)), narrow, keep, tmp, meta)


def _load_source(model_path: str, weights_dir: str | None, name_nodes: bool):
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    source = onnx.load(model_path, load_external_data=False)
    load_external_data_for_model(source, weights_dir or os.path.dirname(os.path.abspath(model_path)))
    if name_nodes:  # fp32-nodes may name an unnamed node by its label, OP_INDEX in this file
        name_unnamed_nodes(source)
    return source


def _convert(source, narrow: str, keep: frozenset[str], tmp: str, meta: dict, name: str = "model") -> str:
    import onnx

    try:
        model, report = convert_float_model_report(source, narrow, keep)
    except ValueError as exc:
        raise InputError(f"cannot convert the model to {narrow}: {exc}",
                         hint="fp32-nodes takes the node names of the model file (unnamed: OP_INDEX)") from exc
    meta.update(converted_to=narrow, casts=report.casts, schema_fp32=list(report.schema_fp32[:20]))
    meta.setdefault("notes", [])
    if report.schema_fp32:
        note = (f"{len(report.schema_fp32)} nodes stay float32: the model's opset does not allow {narrow} "
                f"for them (first: {', '.join(report.schema_fp32[:5])})")
        if note not in meta["notes"]:
            meta["notes"].append(note)
    path = os.path.join(tmp, f"{name}_{narrow}.onnx")
    onnx.save(model, path, save_as_external_data=model.ByteSize() > 1_800_000_000)
    return path


def narrow_session(model_path: str, narrow: str, keep: frozenset[str], weights_dir: str | None, tmp: str,
                   meta: dict, open_session, provider: str = "CUDA provider"):
    """A session of the model converted to ``narrow``; ``open_session(path)`` makes one (BuildError
    when onnxruntime refuses the model).

    onnxruntime's CUDA provider has no kernel for some ops in some narrow types (bf16 above all):
    such a node falls back to the CPU provider, which has none either, and the session fails to
    load. A deployment keeps those ops in float32, and so does this: the op types to keep are found
    by trying (the smallest set whose float32 copy loads, each try one conversion and one session),
    remembered per onnxruntime build in the temporary folder, and said in a note. A model that
    fails to load even with every op type kept in float32 fails for another reason: its own error."""
    source = _load_source(model_path, weights_dir, True)
    present = sorted({node.op_type for node in source.graph.node})
    known = sorted(set(_no_kernel_cache(narrow)) & set(present))
    meta.update(fp32_nodes=sorted(keep))
    tries = {"n": 0}

    def attempt(types):
        tries["n"] += 1
        names = keep | {node.name for node in source.graph.node if node.op_type in set(types)}
        return open_session(_convert(source, narrow, frozenset(names), tmp, meta, f"try{tries['n']}"))

    def loads(types) -> bool:
        try:
            attempt(types)
        except BuildError:
            return False
        return True

    try:
        session, needed = attempt(known), known
    except BuildError as first:
        rest = [t for t in present if t not in known]
        if not rest or not loads(known + rest):
            raise first
        needed = known + _smallest(rest, lambda subset: loads(known + subset))
        _remember_no_kernel(narrow, needed)
        session = attempt(needed)
    if needed:
        count = sum(node.op_type in set(needed) for node in source.graph.node)
        meta["no_kernel_fp32"] = {"op_types": needed, "nodes": count, "tries": tries["n"]}
        meta["notes"].append(f"onnxruntime's {provider} has no {narrow} kernel for {', '.join(needed)}: "
                             f"{count} such nodes kept in float32 between Casts, as a deployment would have to")
    return session


def _smallest(types: list[str], loads) -> list[str]:
    """A small subset of ``types`` for which ``loads`` holds (it holds for all of them): halves,
    then smaller chunks, dropped while the rest still loads."""
    needed = list(types)
    chunk = max(1, len(needed) // 2)
    while True:
        index = 0
        while index < len(needed) and len(needed) > 0:
            trial = needed[:index] + needed[index + chunk:]
            if trial != needed and loads(trial):
                needed = trial
            else:
                index += chunk
        if chunk == 1:
            return needed
        chunk = max(1, chunk // 2)


def _cache_path(narrow: str) -> str:
    import tempfile

    build = onnxruntime_build()
    tag = f"{build.get('package', 'onnxruntime')}-{build.get('version', '')}-{narrow}"
    return os.path.join(tempfile.gettempdir(), f"reprokit-cuda-no-kernel-{tag}.json")


def _no_kernel_cache(narrow: str) -> list[str]:
    try:
        found = read_json(_cache_path(narrow))
    except ValueError:
        return []
    return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []


def _remember_no_kernel(narrow: str, types: list[str]) -> None:
    import json

    path = _cache_path(narrow)
    merged = sorted(set(_no_kernel_cache(narrow)) | set(types))
    try:
        with open(f"{path}.{os.getpid()}", "w", encoding="utf-8") as handle:
            json.dump(merged, handle)
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        pass  # a cache only: the next run finds them again
