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
import urllib.request

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

BROKEN, FIXED = "1.26.0", "1.27.0"  # measured: 1.25.0-1.26.0 refuse the model under ORT_ENABLE_ALL
PACK_REQUIREMENTS = (f"onnxruntime=={BROKEN}", "numpy", "onnx", "onnx-graphsurgeon", "polygraphy", "click", "rich",
                     "jinja2", "ml-dtypes", "packaging")


def _index_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/onnxruntime/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def matrix_cache(tmp_path_factory):
    from reprokit.matrix.envs import find_uv

    if find_uv() is None:
        pytest.skip("uv is not installed: pip install 'reprokit[matrix]'")
    if not _index_reachable():
        pytest.skip("the package index (pypi.org) is not reachable: environments cannot be built")
    folder = tmp_path_factory.mktemp("envs")
    old = os.environ.get("REPROKIT_ENV_CACHE")
    os.environ["REPROKIT_ENV_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("REPROKIT_ENV_CACHE", None)
    else:
        os.environ["REPROKIT_ENV_CACHE"] = old


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
