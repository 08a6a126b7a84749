"""Shared fixtures: model files from tests/models.py, the real ``reprokit`` command, file hashes,
and capability checks that skip with the reason when this machine cannot run a test."""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import models  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PY = shlex.quote(sys.executable)  # for cmd: targets; PATH may not hold the venv's python


@pytest.fixture
def model_file(tmp_path):
    """``model_file("small_mlp")`` saves that generator's model in tmp_path; returns its path."""

    def make(name: str, filename: str | None = None, **kwargs) -> str:
        model = getattr(models, name)(**kwargs)
        return models.save(model, tmp_path / (filename or f"{name}.onnx"))

    return make


def reprokit_exe() -> str:
    exe = Path(sys.executable).parent / "reprokit"
    if not exe.exists():
        pytest.skip(f"the reprokit console script is not installed next to {sys.executable}")
    return str(exe)


def extract_data(archive, dest) -> None:
    """``archive.extractall(dest)`` (a tarfile.TarFile) with the "data" filter where this Python
    has it (3.12, and the 3.10.12 / 3.11.4 security releases): Debian 12's Python 3.11.2, which
    ``requires-python`` admits, lacks the ``filter`` argument. The archives are the tests' own."""
    import tarfile

    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
    else:
        archive.extractall(dest)


def run_cli(*args: str, cwd=None, timeout: float = 180, env: dict | None = None):
    """Run the installed ``reprokit`` command; return the CompletedProcess (text)."""
    child_env = {k: v for k, v in os.environ.items() if k != "REPROKIT_DEBUG"}
    child_env.update(env or {})
    return subprocess.run(
        [reprokit_exe(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def cli():
    return run_cli


def sha_tree(root) -> dict[str, str]:
    """relative path -> sha256 of every file under root (the user's files, to prove them unchanged)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return out


def assert_user_error(
    proc,
    code: int,
    error: str | None = None,
    *,
    contains: str | None = None,
    hint_contains: str | None = None,
) -> tuple[str, str]:
    """One ``Error:`` line, one ``Hint:`` line, the exit code, no traceback. Returns both lines."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{text}"
    assert "Traceback" not in text, text
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    hints = [line for line in lines if line.startswith("Hint: ")]
    assert len(errors) == 1, proc.stderr
    assert len(hints) == 1, proc.stderr
    if error is not None:
        assert errors[0] == f"Error: {error}"
    if contains is not None:
        assert contains in errors[0], errors[0]
    if hint_contains is not None:
        assert hint_contains in hints[0], hints[0]
    return errors[0], hints[0]


@functools.cache
def openvino_bf16_missing() -> str | None:
    """None when OpenVINO runs real bf16 on this CPU; otherwise why not."""
    try:
        import openvino
    except ImportError as exc:
        return f"openvino is not installed ({exc})"
    caps = list(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if "BF16" not in caps:
        return f"this CPU has no BF16 in OpenVINO's OPTIMIZATION_CAPABILITIES ({', '.join(caps)})"
    return None


@functools.cache
def cuda_missing() -> str | None:
    """None when onnxruntime's CUDA provider loads and a GPU is there; otherwise why not."""
    import onnxruntime

    from reprokit.engine.backends.ort_cuda import CUDA, cuda_library_error
    from reprokit.engine.envinfo import gpu_info

    why = "no CUDA provider: onnxruntime-gpu and a GPU needed"
    if CUDA not in onnxruntime.get_available_providers():
        return f"{why} (onnxruntime {onnxruntime.__version__} here is a CPU build)"
    missing = cuda_library_error()
    if missing:
        return f"{why} (the CUDA provider cannot load: {missing})"
    if not gpu_info()["gpus"]:
        return f"{why} (nvidia-smi lists no GPU)"
    return None


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run real CUDA kernels: here they skip, saying what is missing."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and cuda_missing():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=cuda_missing()))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown to pytest without it
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (pytest-xdist; .ci/run uses ``-n 2``) without ``--dist``: whole files go to one
    worker, the files with the most tests first. xdist's default spreads a file's tests over every
    worker, so each would build that file's module-scoped fixtures (shrinks, packs, exports)
    again; a ``--dist`` the user names is theirs."""
    named = [
        *config.invocation_params.args,
        *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
        *config.getini("addopts"),
    ]
    if any(arg == "-d" or arg.startswith("--dist") for arg in named):
        return None
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)


@pytest.fixture
def ov_bf16():
    reason = openvino_bf16_missing()
    if reason:
        pytest.skip(reason)


def pid_gone(pid: int) -> bool:
    """True when pid no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def pack_matmul_softmax(folder: Path):
    """x[1,16] -> MatMul(3e4) -> Softmax: NaN under emulate:fp16, packed into FOLDER/report.tar.gz
    (the archive several test modules start from)."""
    from reprokit.api import RunOptions
    from reprokit.report.bundle import pack

    model = models.save(models.matmul_overflow_softmax(), folder / "model.onnx")
    result = pack(model, "emulate:fp16", str(folder / "report.tar.gz"), options=RunOptions(seed=3))
    assert result.reproduces, result.notes
    return result


def interrupt_when(proc, ready, signum=signal.SIGINT, wait: float = 120) -> str:
    """Send ``signum`` to the running ``proc`` once ``ready()`` holds (polled); its stderr. The
    test fails if the process ended first: an interrupt test that never interrupts proves nothing."""
    try:
        deadline = time.monotonic() + wait
        while not ready() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "shrink finished before it could be interrupted"
        assert ready(), "the awaited state never came"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err


def index_reachable() -> bool:
    """Whether PyPI answers: the matrix tests build real environments from it."""
    import urllib.request

    try:
        urllib.request.urlopen("https://pypi.org/simple/onnxruntime/", timeout=10).close()
        return True
    except OSError:
        return False


def private_env_cache(tmp_path_factory):
    """A fixture body: REPROKIT_ENV_CACHE points at a fresh folder while the fixture lives
    (skipped, saying why, without uv or the package index)."""
    from reprokit.matrix.envs import find_uv

    if find_uv() is None:
        pytest.skip("uv is not installed: pip install 'reprokit[matrix]'")
    if not index_reachable():
        pytest.skip("the package index (pypi.org) is not reachable: environments cannot be built")
    folder = tmp_path_factory.mktemp("envs")
    old = os.environ.get("REPROKIT_ENV_CACHE")
    os.environ["REPROKIT_ENV_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("REPROKIT_ENV_CACHE", None)
    else:
        os.environ["REPROKIT_ENV_CACHE"] = old
