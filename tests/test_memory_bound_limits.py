"""The limits an engine really ran under, said as they are: a data limit reprokit inherited that
is lower than ``--memory-bound`` (a ``ulimit -d``), and a limit on threads and processes (a
cgroup's ``pids.max``, ``ulimit -u``), whose "Resource temporarily unavailable" is no memory.

Found on the merged tree: a ``verify --versions`` cell started under ``ulimit -d`` of 1 GiB said
"ran out of its memory bound of 4 GiB" (the configured bound, not the limit that held); and
``check`` in a cgroup whose pids.max its engine met was exit 11, "ran out of its memory bound of
2 GiB (Resource temporarily unavailable)", or exit 70, "internal error: RuntimeError: can't start
new thread", when reprokit's own thread was the one refused.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import uuid

import pytest
from conftest import reprokit_exe
from test_memory_bound import expand_bomb, hostile, loop_bomb

from reprokit.engine import memorybound
from tests.models import save

LIMIT = 1 << 30  # the data limit the command is started under (ulimit -d 1048576)


def _run(*args: str, preexec=None, timeout: float = 300) -> subprocess.CompletedProcess:
    child = {k: v for k, v in os.environ.items() if k not in ("REPROKIT_DEBUG", memorybound.ENV)}
    return subprocess.run(
        [reprokit_exe(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child,
        stdin=subprocess.DEVNULL,
        preexec_fn=preexec,
    )


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    from conftest import private_env_cache

    yield from private_env_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from conftest import pack_matmul_softmax

    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


@pytest.mark.slow
def test_a_versions_cell_names_the_lower_data_limit_it_inherited(packed, env_cache, tmp_path):
    from tests.test_matrix_trust import SPEC

    archive = hostile(packed, loop_bomb(), tmp_path)

    def ulimit_d() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (LIMIT, LIMIT))

    proc = _run(
        "verify",
        archive,
        "--versions",
        SPEC,
        "--memory-bound",
        "4G",
        "--json",
        "-o",
        str(tmp_path / "m.tar.gz"),
        preexec=ulimit_d,
    )
    assert proc.returncode == 9, proc.stdout + proc.stderr  # no cell could run
    rows = json.loads(proc.stdout)["details"]["rows"]
    assert [r["outcome"] for r in rows] == ["cannot run"], rows
    # old code: "repro.py ran out of its memory bound of 4 GiB (bad_alloc)": a limit that never held
    assert "ran out of the data limit it was started under, 1 GiB" in rows[0]["why"], rows
    assert "lower than --memory-bound's 4 GiB" in rows[0]["why"], rows
    assert "raise ulimit -d" in proc.stderr and "raise --memory-bound" not in proc.stderr


def limits() -> list[int]:
    """pids.max values to try, from 2 up: every one at first, then 1/8 more each, up to what a
    many-core machine's thread pools need (they grow with the cores)."""
    values, n = [], 2
    while n <= 16 * (os.cpu_count() or 1) + 64:
        values.append(n)
        n += max(1, n // 8)
    return values


@pytest.fixture
def pids_cgroup():
    """A pids cgroup of its own (root, cgroup v1 or v2 with the pids controller): ``limit(n)``
    sets its pids.max; processes started with ``preexec_fn=join`` run in it."""
    folder = None
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(root, "cgroup.procs")):
            try:
                folder = os.path.join(root, f"reprokit-test-{uuid.uuid4().hex[:8]}")
                os.mkdir(folder)
            except OSError:
                folder = None
                continue
            if os.path.exists(os.path.join(folder, "pids.max")):
                break
            os.rmdir(folder)
            folder = None
    if folder is None:
        pytest.skip(
            "needs a pids cgroup this test may create (root, a writable cgroup fs) to start a "
            "process under a thread limit; RLIMIT_NPROC does not hold for root"
        )

    class Group:
        def limit(self, n: int) -> None:
            with open(os.path.join(folder, "pids.max"), "w") as handle:
                handle.write(str(n))

        def join(self) -> None:
            with open(os.path.join(folder, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))

    yield Group()
    os.rmdir(folder)  # its processes have ended


def test_a_thread_limit_is_never_called_memory(pids_cgroup, tmp_path):
    """From a pids.max that refuses reprokit's own threads up to one the engine fits under: each
    run is the model's verdict (exit 1: NaN under fp16) or exit 4 naming the pids limit — never
    exit 11 (memory), 70 (internal error) or a verdict made from a refused thread."""
    model = save(expand_bomb(16), tmp_path / "small.onnx")
    seen = {}
    for n in limits():
        pids_cgroup.limit(n)
        proc = _run(
            "check",
            model,
            "--target",
            "emulate:fp16",
            "--memory-bound",
            "2G",
            preexec=pids_cgroup.join,
            timeout=120,
        )
        seen[n] = proc.returncode
        assert proc.returncode in (1, 4), (n, proc.stdout + proc.stderr)
        if proc.returncode == 4:
            assert (
                "could not start a thread" in proc.stderr and f"pids.max of {n}" in proc.stderr
            ), proc.stderr
            assert "memory bound" not in proc.stderr.split("Hint:")[0], proc.stderr
        else:
            break
    assert 4 in seen.values() and seen[max(seen)] == 1, seen  # the limit was met, then fitted under


@pytest.mark.slow
def test_a_versions_cell_refused_a_thread_cannot_run_and_says_why(
    packed, env_cache, pids_cgroup, tmp_path
):
    """verify --versions in a cgroup whose pids.max the cell's engine meets: the cell cannot run
    and says which limit held, never "memory"; reprokit's own refused thread is exit 4. The
    environment is built first, unlimited (uv's own threads are not what is tested)."""
    from tests.test_matrix_trust import SPEC

    def matrix(n: int | None) -> subprocess.CompletedProcess:
        return _run(
            "verify",
            packed,
            "--versions",
            SPEC,
            "--memory-bound",
            "2G",
            "--json",
            "-j",
            "1",
            "-o",
            str(tmp_path / f"m{n}.tar.gz"),
            preexec=pids_cgroup.join if n else None,
        )

    built = matrix(None)
    assert built.returncode == 0, built.stdout + built.stderr  # the cell reproduces, unlimited
    seen = {}
    for n in limits():
        pids_cgroup.limit(n)
        proc = matrix(n)
        seen[n] = proc.returncode
        text = proc.stdout + proc.stderr
        assert proc.returncode in (0, 4, 9), (n, text)
        # old code: the cell "ran out of its memory bound of 2 GiB (... Resource temporarily unavailable)"
        assert "memory bound of" not in text, (n, text)
        if proc.returncode == 9:
            rows = json.loads(proc.stdout)["details"]["rows"]
            assert [r["outcome"] for r in rows] == ["cannot run"], rows
            assert "could not start a thread" in rows[0]["why"] and "pids.max" in rows[0]["why"], (
                rows
            )
            assert "limit on threads and processes" in proc.stderr, proc.stderr
        if proc.returncode == 0:
            break
    assert 9 in seen.values() and seen[max(seen)] == 0, (
        seen
    )  # a cell met the limit, then fitted under
