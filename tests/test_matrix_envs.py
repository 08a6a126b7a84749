"""The matrix on real environments (issue 27): an archive of a real onnxruntime regression
(microsoft/onnxruntime#28413, samples/matrix/make_cse_string_attr.py) packed under onnxruntime
1.26.0 in a uv environment, then ``verify --versions`` over two releases built with uv from the
package index, ``--bisect`` naming the releases where it broke and where it was fixed, and the
same matrix as Ray tasks on a local in-process cluster whose custom resources stand in for GPU
kinds. Environments go to a session folder; uv's own cache keeps the wheels between runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO, index_reachable, private_env_cache

pytestmark = pytest.mark.slow

BROKEN, FIXED = "1.26.0", "1.27.0"  # measured: 1.25.0-1.26.0 refuse the model under ORT_ENABLE_ALL
PACK_REQUIREMENTS = (f"onnxruntime=={BROKEN}", "numpy", "onnx", "onnx-graphsurgeon", "polygraphy", "click", "rich",
                     "jinja2", "ml-dtypes", "packaging")


@pytest.fixture(scope="session")
def matrix_cache(tmp_path_factory):
    yield from private_env_cache(tmp_path_factory)


@pytest.fixture(scope="session")
def cse_archive(matrix_cache, tmp_path_factory):
    """The archive as a user on onnxruntime 1.26.0 packs it: reprokit run in that environment."""
    sys.path.insert(0, str(REPO / "samples" / "matrix"))
    import make_cse_string_attr

    from reprokit.matrix.envs import EnvRequest, ensure_env

    env = ensure_env(EnvRequest(PACK_REQUIREMENTS))
    folder = tmp_path_factory.mktemp("cse")
    model, inputs = make_cse_string_attr.write(str(folder))
    archive = folder / "cse.tar.gz"
    done = subprocess.run([env.python, "-m", "reprokit", "pack", model, "--inputs", inputs, "--target", "ort:opt",
                           "-o", str(archive)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert "reproduces here" in done.stdout + done.stderr
    return archive


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _member(archive, name) -> str:
    with tarfile.open(archive) as handle:
        member = next(m for m in handle.getmembers() if m.name.endswith("/" + name))
        return handle.extractfile(member).read().decode()


def test_versions_table_over_two_releases(cse_archive, tmp_path):
    from reprokit.errors import UsageError
    from reprokit.matrix.run import verify_versions

    before = _digest(cse_archive)
    out = tmp_path / "cse.matrix.tar.gz"
    result = verify_versions(str(cse_archive), f"onnxruntime=={BROKEN},{FIXED}", out_path=str(out))
    assert [(r["version"], r["outcome"]) for r in result.rows] == [
        (BROKEN, "reproduces"), (FIXED, "does not reproduce")]
    assert all(r["packages"]["onnxruntime"] == r["version"] for r in result.rows)  # the cell's own environment
    assert _digest(cse_archive) == before  # the user's archive is never changed
    payload = json.loads(_member(out, "matrix.json"))
    assert payload["schema"] == "reprokit.matrix/1" and payload["packed_with"] == BROKEN
    issue = _member(out, "ISSUE.md")
    assert f"reproduces on onnxruntime {BROKEN}; does not reproduce on onnxruntime {FIXED}" in issue
    assert "Not yet tried" not in issue and "Not run on TensorRT" not in issue
    again = verify_versions(str(cse_archive), f"onnxruntime=={FIXED}", out_path=str(out))  # ours: replaced
    assert [r["outcome"] for r in again.rows] == ["does not reproduce"]
    mine = tmp_path / "mine.tar.gz"
    mine.write_bytes(b"not reprokit's")
    with pytest.raises(UsageError, match="not a matrix archive reprokit wrote"):
        verify_versions(str(cse_archive), f"onnxruntime=={FIXED}", out_path=str(mine))
    assert mine.read_bytes() == b"not reprokit's"


def test_bisect_names_where_it_broke_and_where_it_was_fixed(cse_archive, tmp_path):
    from reprokit.matrix.run import verify_versions

    result = verify_versions(str(cse_archive), "onnxruntime>=1.24.4,<1.28", bisect=True,
                             out_path=str(tmp_path / "b.matrix.tar.gz"))
    found = result.payload["bisect"]
    assert [(b["kind"], b["before"], b["after"]) for b in found["boundaries"]] == [
        ("broke", "1.24.4", "1.25.0"), ("fixed", BROKEN, FIXED)]
    assert found["environments"] < len(found["versions"])  # 1.26.0 known from the pack; the rest searched
    assert "first fixed release 1.27.0" in _member(tmp_path / "b.matrix.tar.gz", "ISSUE.md")


def test_verify_versions_command_prints_the_table(cse_archive, tmp_path):
    out = tmp_path / "c.matrix.tar.gz"
    done = subprocess.run([sys.executable, "-m", "reprokit", "verify", str(cse_archive), "--versions",
                           f"onnxruntime=={BROKEN},{FIXED}", "-o", str(out), "--json"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert [r["outcome"] for r in payload["rows"]] == ["reproduces", "does not reproduce"]
    assert payload["archive"] == str(out)


def _cli(*args, env_cache, timeout=600, **env):
    return subprocess.run([sys.executable, "-m", "reprokit", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "REPROKIT_ENV_CACHE": str(env_cache), **env})


def test_no_release_can_run_is_exit_9_and_writes_nothing(cse_archive, tmp_path):
    """Every cell 'cannot run' (uv's index unreachable, so no environment builds): the table
    says why, no archive claims an answer, exit 9 (never 0 on a guess); the newest pin is not
    called "latest" when the index could not be listed."""
    out = tmp_path / "none.matrix.tar.gz"
    args = ["verify", str(cse_archive), "--versions", f"onnxruntime=={BROKEN},{FIXED}", "-o", str(out)]
    done = _cli(*args, env_cache=tmp_path / "envs", UV_DEFAULT_INDEX="http://127.0.0.1:9/simple")
    assert done.returncode == 9, done.stderr
    assert "Error: no release could run: 2 cells, each 'cannot run'" in done.stderr
    assert "Hint:" in done.stderr and "package index reachable" in done.stderr and "Traceback" not in done.stderr
    assert "cannot run" in done.stdout and "(latest)" not in done.stdout and not out.exists()
    assert f"{FIXED} cannot run: environment: uv pip install failed: " in done.stdout  # the whole reason
    done = _cli(*args, "--json", env_cache=tmp_path / "envs", UV_DEFAULT_INDEX="http://127.0.0.1:9/simple")
    error = json.loads(done.stdout)  # one object: the error, with the table as far as it went
    assert done.returncode == 9 and (error["schema"], error["exit_code"]) == ("reprokit.error/1", 9)
    payload = error["details"]
    assert payload["answer"] == "no-cell-ran" and payload["archive"] is None
    assert payload["latest"] is None and all("uv pip install failed" in r["why"] for r in payload["rows"])


def test_ctrl_c_stops_the_running_cell_and_starts_no_queued_one(cse_archive, tmp_path):
    """SIGINT to reprokit alone (as SIGTERM would come): the uv build under way is killed, the
    queued cells never start, exit 130 with one Error/Hint pair, no half environment left."""
    import signal
    import time

    cache = tmp_path / "envs"
    process = subprocess.Popen([sys.executable, "-m", "reprokit", "verify", str(cse_archive), "--versions",
                                "onnxruntime==1.24.4,1.25.0,1.25.1,1.27.0", "-j", "1", "-o", str(tmp_path / "i.tar.gz")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "REPROKIT_ENV_CACHE": str(cache)})
    deadline = time.monotonic() + 120
    while not any(p.is_dir() for p in cache.glob("*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first environment is being built
    assert process.poll() is None, "the first cell ended before it could be interrupted"
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    took = time.monotonic() - interrupted
    assert process.returncode == 130, err
    assert "Error: interrupted" in err and "Hint:" in err and "Traceback" not in err
    assert took < 20, f"{took:.1f} s after Ctrl-C: queued cells ran on"
    time.sleep(1)
    built = [p.name for p in cache.iterdir() if p.is_dir()]
    assert built == [], f"environments left after the interrupt: {built}"  # killed build removed, none started
    assert not (tmp_path / "i.tar.gz").exists()


def test_matrix_clean_frees_what_it_built_and_nothing_else(tmp_path):
    """Two real environments (uv), a user's file and a look-alike folder in the cache: clean
    --dry-run removes nothing; clean removes the two, reports the bytes freed (inodes whose every
    link went), leaves the rest; an environment whose lock is held (being built) is kept."""
    import fcntl

    from reprokit.matrix.envs import EnvRequest, ensure_env, find_uv

    if find_uv() is None:
        pytest.skip("uv is not installed: pip install 'reprokit[matrix]'")
    if not index_reachable():
        pytest.skip("the package index (pypi.org) is not reachable: environments cannot be built")
    cache = tmp_path / "envs"
    os.environ["REPROKIT_ENV_CACHE"], old = str(cache), os.environ.get("REPROKIT_ENV_CACHE")
    try:
        kept = ensure_env(EnvRequest(("ml-dtypes==0.5.1",)))
        gone = ensure_env(EnvRequest(("packaging==24.2",)))
    finally:
        os.environ.pop("REPROKIT_ENV_CACHE") if old is None else os.environ.__setitem__("REPROKIT_ENV_CACHE", old)
    (cache / "notes.txt").write_text("mine")
    (cache / ("0" * 20)).mkdir()  # a key-like name reprokit did not build: no marker, no lock
    dry = _cli("matrix", "clean", "--dry-run", "--json", env_cache=cache)
    assert dry.returncode == 0, dry.stderr
    assert sorted(json.loads(dry.stdout)["removed"]) == sorted([os.path.basename(kept.path), os.path.basename(gone.path)])
    assert os.path.isdir(kept.path) and os.path.isdir(gone.path)
    with open(kept.path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as ensure_env holds it while building
        done = _cli("matrix", "clean", env_cache=cache)
    assert done.returncode == 0, done.stderr
    assert "removed 1 environment in" in done.stdout and "freed " in done.stdout and " bytes)" in done.stdout
    assert "kept 1 in use or being built now" in done.stdout and "left alone" in done.stdout
    assert not os.path.exists(gone.path) and os.path.isdir(kept.path)
    assert (cache / "notes.txt").read_text() == "mine" and (cache / ("0" * 20)).is_dir()
    again = json.loads(_cli("matrix", "clean", "--json", env_cache=cache).stdout)
    assert again["removed"] == [os.path.basename(kept.path)] and again["freed_bytes"] > 0
    assert again["freed_bytes"] + again["linked_bytes"] > 1_000_000  # ml-dtypes' files, linked or not


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'reprokit[matrix]'")
    # Two fake GPUs and two kinds: Ray schedules on the resources it is told of; the cells run on the CPU.
    ray.init(num_cpus=2, num_gpus=2, resources={"accelerator_type:L4": 1, "accelerator_type:A100": 1},
             include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_matrix_on_a_local_ray_cluster_with_gpu_kinds(cse_archive, tmp_path, ray_cluster):
    from reprokit.matrix.run import verify_versions

    result = verify_versions(str(cse_archive), f"onnxruntime=={BROKEN},{FIXED}", ray_address="auto",
                             gpus=("L4", "A100", "H100"), out_path=str(tmp_path / "r.matrix.tar.gz"))
    cells = {(r["version"], r["gpu"]): r["outcome"] for r in result.rows}
    assert cells == {(BROKEN, "L4"): "reproduces", (BROKEN, "A100"): "reproduces", (BROKEN, "H100"): "cannot run",
                     (FIXED, "L4"): "does not reproduce", (FIXED, "A100"): "does not reproduce",
                     (FIXED, "H100"): "cannot run"}
    assert all("accelerator_type H100" in r["why"] for r in result.rows if r["gpu"] == "H100")


def test_check_many_models_on_ray(tmp_path, ray_cluster, capsys, model_file):
    from reprokit.matrix.fanout import check_many

    agree = model_file("small_mlp")
    diverge = str(REPO / "samples" / "log_div_underflow.onnx")
    code = check_many([agree, diverge], ["--target", "emulate:fp16"], out_dir=None, as_json=True,
                      ray_address="auto", gpus=None, jobs=2)
    payload = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [r["exit_code"] for r in payload["results"]] == [0, 1]
    assert payload["results"][1]["check"]["verdict"]["diverges"] is True
