"""The memory bound of engine workers (engine/memorybound.py): a model from a stranger that
allocates without end stops at the bound as exit 11 ("the engine ran out of its memory bound"),
never a crash of reprokit, a hang, the machine swapping, or a verdict.

Safe on the test machine whatever the code under test does: every CLI run here starts under an
outer RLIMIT_DATA of 4 GiB (``GUARD``), inherited by reprokit and its workers, and the bound under
test is far below it. On code without the bound each bomb ran until it failed at the guard, and
the failure was taken for the model's: the 1.5 GiB Expand's emulator run (std::bad_alloc) as a
build error, "DOES NOT REPRODUCE", exit 0 — a verdict from a machine's limit —, the Loop as
"the reference fails", exit 5. On a machine without a guard: swap, or the OOM killer.
"""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_user_error, pack_matmul_softmax, reprokit_exe
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine import memorybound
from reprokit.engine.worker import _bound_for, run_in_worker
from reprokit.standalone.arrays import save_npz
from tests.models import const, make, save, vi
from tests.test_qa_archives import edited

GUARD = 4 << 30


def expand_bomb(rows: int) -> onnx.ModelProto:
    """The archive's model (x -> MatMul(3e4) -> Softmax -> y, NaN under fp16) behind an Expand to
    ``rows`` copies of x: the same outputs, 64·rows bytes allocated on the way."""
    # x[1,16] -> Expand([rows,16]) -> ReduceMean(axis 0) -> MatMul(3e4) -> Softmax -> y[1,4]
    return make(
        [
            helper.make_node("Expand", ["x", "shape"], ["big"], name="expand"),
            helper.make_node("ReduceMean", ["big"], ["m"], name="mean", axes=[0], keepdims=1),
            helper.make_node("MatMul", ["m", "W"], ["h"], name="matmul"),
            helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1),
        ],
        [vi("x", [1, 16])],
        [vi("y", [1, 4])],
        [
            numpy_helper.from_array(np.array([rows, 16], np.int64), "shape"),
            const("W", np.full((16, 4), 3e4)),
        ],
    )


def loop_bomb(trips: int = 64) -> onnx.ModelProto:
    """A Loop that doubles a tensor ``trips`` times (2^64 rows: no machine holds it)."""
    # x[1,16] -> Loop(trips: v = Concat(v, v)) -> ReduceMean(axis 0) -> MatMul(3e4) -> Softmax -> y[1,4]
    body = helper.make_graph(
        [
            helper.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "grow",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
        ],
    )
    return make(
        [
            helper.make_node("Loop", ["trips", "", "x"], ["big"], body=body, name="loop"),
            helper.make_node("ReduceMean", ["big"], ["m"], name="mean", axes=[0], keepdims=1),
            helper.make_node("MatMul", ["m", "W"], ["h"], name="matmul"),
            helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1),
        ],
        [vi("x", [1, 16])],
        [vi("y", [1, 4])],
        [
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            const("W", np.full((16, 4), 3e4)),
        ],
    )


def guarded(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``reprokit ARGS`` under the outer guard (RLIMIT_DATA, inherited by every worker)."""
    import os

    def guard() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (GUARD, GUARD))

    child = {k: v for k, v in os.environ.items() if k not in ("REPROKIT_DEBUG", memorybound.ENV)}
    return subprocess.run(
        [reprokit_exe(), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**child, **(env or {})},
        stdin=subprocess.DEVNULL,
        preexec_fn=guard,
    )


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_matmul_softmax(tmp_path_factory.mktemp("pack")).archive


def hostile(archive: str, model: onnx.ModelProto, tmp_path: Path) -> str:
    """The archive with its model.onnx swapped for ``model``, MANIFEST.json rewritten to match
    (what a sender who means harm does)."""
    return edited(archive, tmp_path, {"model.onnx": model.SerializeToString()})


def test_verify_stops_an_archive_that_allocates_past_the_bound(packed, tmp_path):
    # old code: the reference ran it; the emulator's copies failed at the test's guard with
    # std::bad_alloc, judged a build error: "DOES NOT REPRODUCE here", exit 0
    archive = hostile(packed, expand_bomb(24 << 20), tmp_path)  # 24M rows x 16 float32 = 1.5 GiB
    error, hint = assert_user_error(
        guarded("verify", archive, "--memory-bound", "512M"),
        11,
        contains="engine ran out of its memory bound of 512 MiB",
    )
    assert "no verdict" in error and "--memory-bound 1G" in hint
    # the same bound from the environment, the way verify --versions's cells and the API get it
    assert_user_error(
        guarded("verify", archive, env={memorybound.ENV: "512M"}),
        11,
        contains="memory bound of 512 MiB",
    )


def test_verify_stops_a_loop_that_grows_without_end(packed, tmp_path):
    # old code: the Loop grew until the allocation failed at the test's outer guard (on a
    # machine without one: until swap or the OOM killer); verify said "the reference fails", exit 5
    archive = hostile(packed, loop_bomb(), tmp_path)
    assert_user_error(
        guarded("verify", archive, "--memory-bound", "768M"),
        11,
        contains="the reference (ort) engine ran out of its memory bound of 768 MiB",
    )


@pytest.mark.parametrize("engine", ["emulate:fp16", "openvino:f32"])
def test_each_cpu_engine_reports_the_bound_as_the_bound(tmp_path, engine):
    """The engine named as reference and target: its own allocator's failure is the one seen."""
    if engine.startswith("openvino"):
        pytest.importorskip("openvino", reason="OpenVINO is the openvino extra")
    model = save(expand_bomb(24 << 20), tmp_path / "bomb.onnx")
    proc = guarded(
        "check", model, "--target", engine, "--reference", engine, "--memory-bound", "512M"
    )
    assert_user_error(
        proc, 11, contains=f"the reference ({engine}) engine ran out of its memory bound of 512 MiB"
    )


def test_a_model_within_the_bound_runs_and_the_bound_is_the_workers(tmp_path, monkeypatch):
    """The same Expand at 1 MiB runs under a 512 MiB bound; at 1 GiB the worker says "memory"
    with the bound it ran under, which the parent never applies to itself."""
    feeds = str(tmp_path / "feeds.npz")
    save_npz(feeds, {"x": np.full((1, 16), 0.5, np.float32)})
    monkeypatch.setenv(memorybound.ENV, "512M")
    small = run_in_worker(
        "ort", save(expand_bomb(1 << 14), tmp_path / "small.onnx"), feeds, str(tmp_path / "a")
    )
    assert small.status == "ok", small.message
    big = run_in_worker(
        "ort", save(expand_bomb(16 << 20), tmp_path / "big.onnx"), feeds, str(tmp_path / "b")
    )
    assert (big.status, big.meta.get("bound")) == ("memory", 512 << 20), big.message
    assert resource.getrlimit(resource.RLIMIT_DATA)[0] != 512 << 20


def test_gpu_engines_are_bounded_never_below_their_floor_and_check_commands_not(monkeypatch):
    """Measured on an H200 (bench/results/gpu_memory_bound.md): the CUDA provider takes 1.1-1.7
    GiB of host data, TensorRT-RTX's build 0.85 GiB, and both hung under 512 MiB: a GPU worker's
    bound is the one in force, never below GPU_FLOOR. Old code: GPU workers had none."""
    monkeypatch.setenv(memorybound.ENV, "8G")
    assert _bound_for("ort:cuda,fp16") == _bound_for("trt:fp16") == _bound_for("ort") == 8 << 30
    monkeypatch.setenv(memorybound.ENV, "1G")
    assert _bound_for("emulate:fp16") == _bound_for("ort") == _bound_for("openvino:bf16") == 1 << 30
    assert _bound_for("trt:fp16") == _bound_for("ort:cuda") == memorybound.GPU_FLOOR == 2 << 30
    assert _bound_for("cmd:python check.py {model}") is None
    monkeypatch.setenv(memorybound.ENV, "off")
    assert _bound_for("ort") is None and _bound_for("ort:cuda") is None
    monkeypatch.delenv(memorybound.ENV)
    assert _bound_for("ort") == _bound_for("ort:cuda") == memorybound.default_bound() > 0
    # onnxruntime's CUDA arena words a GPU out-of-memory as its CPU one does: a GPU worker's
    # message names both, never the host bound alone (the cause reprokit cannot tell apart)
    assert [_bound_for(s, gpu=True) for s in ("ort:cuda", "trt:fp16", "ort", "emulate:fp16", "cmd:x {model}")] == [
        True, True, False, False, False]
    said = "Failed to allocate memory for requested buffer of size 1073741824"
    assert memorybound.ran_out_words(2 << 30, said, gpu=True).startswith(
        "ran out of memory: its host memory bound of 2 GiB, or the GPU's own memory (Failed to allocate")
    assert memorybound.ran_out_words(2 << 30, said) .startswith("ran out of its memory bound of 2 GiB (")


def host_bomb(rows: int) -> onnx.ModelProto:
    """An Expand the CUDA provider cannot run (strings): host memory, 32 bytes an element."""
    # x[1,16] -> Cast(string) -> Expand([rows,16]) -> Cast(float) -> ReduceMean(0) -> Add(x) -> y[1,16]
    return make(
        [
            helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING, name="to_string"),
            helper.make_node("Expand", ["s", "shape"], ["big"], name="expand"),
            helper.make_node("Cast", ["big"], ["f"], to=TensorProto.FLOAT, name="cast"),
            helper.make_node("ReduceMean", ["f"], ["m"], name="mean", axes=[0], keepdims=1),
            helper.make_node("Add", ["m", "x"], ["y"], name="add"),
        ],
        [vi("x", [1, 16])],
        [vi("y", [1, 16])],
        [numpy_helper.from_array(np.array([rows, 16], np.int64), "shape")],
    )


@pytest.mark.gpu
def test_a_cuda_worker_stops_a_host_allocation_at_its_bound(tmp_path, monkeypatch):
    """ort:cuda runs the string Expand on the CPU side of the CUDA session: 4 GiB asked under a
    2 GiB bound is "memory", where the old code's unbounded worker allocated it all."""
    feeds = str(tmp_path / "feeds.npz")
    save_npz(feeds, {"x": np.full((1, 16), 0.5, np.float32)})
    monkeypatch.setenv(memorybound.ENV, "2G")
    small = run_in_worker(
        "ort:cuda", save(host_bomb(1 << 10), tmp_path / "small.onnx"), feeds, str(tmp_path / "a")
    )
    assert small.status == "ok", small.message
    big = run_in_worker(
        "ort:cuda", save(host_bomb(8 << 20), tmp_path / "big.onnx"), feeds, str(tmp_path / "b")
    )
    assert (big.status, big.meta.get("bound")) == ("memory", 2 << 30), big.message


def test_the_host_bomb_allocates_on_the_host(tmp_path, monkeypatch):
    """What the gpu test above relies on, shown on the CPU: the string Expand's one allocation
    is refused at the worker's bound (1 GiB asked, 32 bytes an element, under 512 MiB)."""
    feeds = str(tmp_path / "feeds.npz")
    save_npz(feeds, {"x": np.full((1, 16), 0.5, np.float32)})
    monkeypatch.setenv(memorybound.ENV, "512M")
    big = run_in_worker(
        "ort", save(host_bomb(2 << 20), tmp_path / "big.onnx"), feeds, str(tmp_path / "b")
    )
    assert (big.status, big.meta.get("bound")) == ("memory", 512 << 20), big.message


def test_a_bad_bound_is_a_usage_error(tmp_path):
    proc = guarded("verify", str(tmp_path / "none.tar.gz"), "--memory-bound", "lots")
    assert_user_error(proc, 2, contains="cannot parse --memory-bound 'lots'")


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory):
    from conftest import private_env_cache

    yield from private_env_cache(tmp_path_factory)


@pytest.mark.slow
def test_a_versions_cell_that_allocates_without_end_cannot_run(
    packed, env_cache, tmp_path, monkeypatch
):
    """verify --versions runs reprokit's reproducer in each release's environment: under the
    bound there too. The guard (RLIMIT_DATA of this process, inherited by the cell) keeps the
    machine safe on code without the bound, where the cell's Loop grew until it failed at the
    guard and was taken for the model's failure."""
    from reprokit.errors import MatrixNoAnswer
    from reprokit.matrix.run import verify_versions
    from tests.test_matrix_trust import SPEC

    archive = hostile(packed, loop_bomb(), tmp_path)
    monkeypatch.setenv(memorybound.ENV, "768M")
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (GUARD, hard))
    try:
        with pytest.raises(MatrixNoAnswer) as caught:  # no cell could run: exit 9's error
            verify_versions(archive, SPEC, out_path=str(tmp_path / "m.tar.gz"))
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    rows = caught.value.result.rows
    assert [r["outcome"] for r in rows] == ["cannot run"], rows
    assert "repro.py ran out of its memory bound of 768 MiB" in rows[0]["why"], rows


def test_a_lower_limit_the_worker_inherits_is_never_raised(tmp_path, monkeypatch):
    """An outer limit (a ulimit, a test's guard) lower than the bound holds: the worker lowers
    its soft limit, never raises it. Before, a soft limit of the parent was raised to the bound
    (a guard lifted: a cell's Loop reached 12 GiB under a 4 GiB soft guard)."""
    feeds = str(tmp_path / "feeds.npz")
    save_npz(feeds, {"x": np.full((1, 16), 0.5, np.float32)})
    monkeypatch.setenv(memorybound.ENV, "64G")
    used = next(
        int(line.split()[1]) << 10
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmData:")
    )
    outer = max(768 << 20, used + (256 << 20))
    model = save(
        expand_bomb(outer // 64 + (8 << 20)), tmp_path / "bomb.onnx"
    )  # 512 MiB past the outer limit
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (outer, hard))
    try:
        result = run_in_worker("ort", model, feeds, str(tmp_path / "job"))
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    assert (result.status, result.meta.get("bound")) == ("memory", outer), result.message


def four_expands(rows: int = 2 << 20) -> onnx.ModelProto:
    """Four branches that each Expand x to ``rows`` rows (128 MiB at the default): the model runs
    them one after the other, a survey pack holds them side by side."""
    # x[1,16] -> Mul(1..4) -> Expand([rows,16]) -> ReduceMean(axis 0) (x4) -> Sum -> MatMul(3e4) -> Softmax -> y[1,4]
    nodes, means = [], []
    inits = [
        numpy_helper.from_array(np.array([rows, 16], np.int64), "shape"),
        const("W", np.full((16, 4), 3e4)),
    ]
    for i in range(4):
        inits.append(const(f"s{i}", np.float32(1 + i)))
        nodes += [
            helper.make_node("Mul", ["x", f"s{i}"], [f"x{i}"], name=f"scale{i}"),
            helper.make_node("Expand", [f"x{i}", "shape"], [f"big{i}"], name=f"expand{i}"),
            helper.make_node(
                "ReduceMean", [f"big{i}"], [f"m{i}"], name=f"mean{i}", axes=[0], keepdims=1
            ),
        ]
        means.append(f"m{i}")
    nodes += [
        helper.make_node("Sum", means, ["s"], name="sum"),
        helper.make_node("MatMul", ["s", "W"], ["h"], name="matmul"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1),
    ]
    return make(nodes, [vi("x", [1, 16])], [vi("y", [1, 4])], inits)


@pytest.mark.slow
def test_shrink_splits_a_pack_past_the_bound_and_ends_as_unbounded(tmp_path):
    """shrink's workers are bounded too: a survey pack past the bound fails as a whole and is
    split, as any failed pack (more calls: 14 here, 3 unbounded); the model itself fits, so the
    run ends with the same minimal model, never exit 11."""
    model = save(four_expands(), tmp_path / "branches.onnx")
    out = tmp_path / "out"
    proc = guarded(
        "shrink",
        model,
        "--target",
        "emulate:fp16",
        "-o",
        str(out),
        "--no-pack",
        "--max-calls",
        "0",
        "--memory-bound",
        "700M",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the packed call that held it failed as a whole" in proc.stderr
    minimal = onnx.load(out / "minimal.onnx")
    assert [n.op_type for n in minimal.graph.node] == ["MatMul"]
