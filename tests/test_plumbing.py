"""ONNX and file plumbing (issue 16, findings 6, 7 and 9): models with external data saved
atomically under their final name, engine calls that leave nothing behind, string outputs,
the activation index, the rerun command, and the LayerNorm rewrite of fp16 models.

Real engines throughout (onnxruntime, the emulate backend, cmd scripts) on tiny generated models.
The 2 GB external-data threshold is lowered in one test: it is a size, not the code under test.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import shrink_models as sm
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.api import RunOptions
from reprokit.shrink.budget import Limits
from reprokit.shrink.steps import shrink

FLOAT = TensorProto.FLOAT


def data_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".data"))


# -- finding 6: external data saved atomically under the final name -----------------------------


def overflow_chain():
    """Three 16x16 MatMuls (1 KiB weights: onnx's external-data writer keeps smaller tensors
    inline); the middle one's weights are 3e4: its output overflows fp16."""
    # x[1,16] -> MatMul(W0) -> a -> Relu -> b -> MatMul(W1 = 3e4) -> c (inf in fp16) -> MatMul(W2) -> y
    rng = np.random.default_rng(0)
    weights = [rng.uniform(0.1, 0.2, (16, 16)), np.full((16, 16), 3e4), rng.uniform(0.1, 0.2, (16, 16))]
    return sm.make(
        [
            sm.node("MatMul", ["x", "W0"], ["a"], "m0"),
            sm.node("Relu", ["a"], ["b"], "r0"),
            sm.node("MatMul", ["b", "W1"], ["c"], "m1"),
            sm.node("MatMul", ["c", "W2"], ["y"], "m2"),
        ],
        [sm.vi("x", [1, 16])],
        [sm.vi("y", [1, 16])],
        [sm.const(f"W{i}", w) for i, w in enumerate(weights)],
    )


def test_best_so_far_writes_leave_one_data_file_under_the_final_name(tmp_path, monkeypatch):
    import reprokit.graph.io
    from tests.models import save_external

    # A big model as exported: weights in an external file, read from where they are. The
    # minimal model is saved self-contained, so past the (lowered) threshold it gets its own data.
    monkeypatch.setattr(reprokit.graph.io, "_TWO_GB", 500)
    path = save_external(overflow_chain(), tmp_path / "chain.onnx")
    out = tmp_path / "out"
    result = shrink(path, "emulate:fp16", str(out), options=RunOptions(seed=1), limits=Limits(max_calls=None))
    summary = result.summary
    assert summary["signature"]["kind"] == "nonfinite"
    writes = sum(s["accepted"] for s in summary["steps"]) + 1  # every accept, then "done"
    assert writes >= 2, summary["steps"]
    assert data_files(out) == ["minimal.onnx.data"]
    minimal = onnx.load(str(out / "minimal.onnx"), load_external_data=False)
    weight_bytes = sum(len(numpy_helper.to_array(t, str(out)).tobytes()) for t in minimal.graph.initializer)
    assert weight_bytes > 0 and os.path.getsize(out / "minimal.onnx.data") == weight_bytes
    locations = {e.value for t in minimal.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"minimal.onnx.data"}
    onnx.checker.check_model(onnx.load(str(out / "minimal.onnx")))
    assert not [p for p in os.listdir(out) if p.startswith(".") and p != ".reprokit"]  # no staging leftovers
    proc = run_cli("check", str(out / "minimal.onnx"), "--target", "emulate:fp16",
                   "--inputs", str(out / "inputs.npz"))
    assert proc.returncode == 1, proc.stderr


def test_saving_again_replaces_the_data_file_and_a_small_model_removes_it(tmp_path, monkeypatch):
    import reprokit.graph.io
    from reprokit.graph.io import save_model

    monkeypatch.setattr(reprokit.graph.io, "_TWO_GB", 500)
    model = overflow_chain()
    target = str(tmp_path / "m.onnx")
    for _ in range(2):
        save_model(model, target)
        assert data_files(tmp_path) == ["m.onnx.data"]
        assert os.path.getsize(tmp_path / "m.onnx.data") == 3 * 16 * 16 * 4
    assert len(model.graph.initializer[0].raw_data) == 1024  # the caller's model keeps its weights
    monkeypatch.setattr(reprokit.graph.io, "_TWO_GB", 2_000_000_000)
    save_model(model, target)
    assert data_files(tmp_path) == []
    onnx.checker.check_model(onnx.load(target))


# -- finding 7: crashed and timed-out calls leave no feeds ----------------------------------------


CRASH_SCRIPT = """
    # Whenever the model holds a Sigmoid node, takes down its whole process group by SIGSEGV:
    # the engine worker dies with it, as it does when an in-process engine (TensorRT) segfaults.
    import os, signal, sys
    if b"Sigmoid" in open(sys.argv[1], "rb").read():
        sys.stdout.flush()
        os.killpg(0, signal.SIGSEGV)
"""


def test_a_crash_hunting_shrink_leaves_no_feeds_behind(tmp_path):
    model = sm.pair_chain(length=12, first=4, second=9)
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "crash.py", CRASH_SCRIPT)
    out = tmp_path / "out"
    result = shrink(path, f"cmd:{sm.PY} {script} {{model}}", str(out), limits=Limits(max_calls=None))
    assert result.summary["signature"]["kind"] == "crash"
    assert result.summary["minimal"]["ops"] == ["Sigmoid"]
    calls = out / ".reprokit" / "calls"
    left = [str(p.relative_to(calls)) for p in calls.rglob("feeds.npz")]
    assert left == []


def test_a_timed_out_call_leaves_no_feeds_behind(tmp_path):
    from reprokit.api import make_oracle

    path = sm.save(sm.pair_chain(length=4, first=1, second=2), tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "slow.py", "import time\ntime.sleep(30)\n")
    oracle = make_oracle(f"cmd:{sm.PY} {script}", RunOptions(timeout=1.0), str(tmp_path / "calls"))
    feeds = {"x": np.ones((1, 8), np.float32)}
    verdict = oracle.judge(path, feeds, reference_outputs={"y": np.ones((1, 8), np.float32)})
    assert verdict.kind.value == "timeout"
    assert list((tmp_path / "calls").rglob("feeds.npz")) == []


# -- finding 9: string outputs, the activation index, the rerun command, fp16 LayerNorm ---------


def string_output_model():
    """A float output and a string output made from it."""
    # x[2] -> Relu -> y[2] ; y -> Cast(to=STRING) -> s[2]
    return sm.make(
        [sm.node("Relu", ["x"], ["y"], "relu"), sm.node("Cast", ["y"], ["s"], "cast", to=TensorProto.STRING)],
        [sm.vi("x", [2])],
        [sm.vi("y", [2]), sm.vi("s", [2], TensorProto.STRING)],
    )


@pytest.mark.parametrize("target", ["ort:opt", "emulate:fp16"])
def test_string_outputs_are_compared_by_equality(tmp_path, target):
    path = sm.save(string_output_model(), tmp_path / "s.onnx")
    proc = run_cli("check", path, "--target", target, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    outputs = {o["name"]: o for o in json.loads(proc.stdout)["verdict"]["outputs"]}
    assert set(outputs) == {"y", "s"}
    if target == "ort:opt":
        assert proc.returncode == 0 and outputs["s"]["mismatched"] == 0


def test_compare_arrays_counts_unequal_strings():
    from reprokit.standalone.compare import Criterion, compare_arrays

    same = compare_arrays("s", np.array(["a", "b"]), np.array(["a", "b"], dtype=object), Criterion())
    assert not same.exceeds and same.error == 0 and same.mismatched == 0
    differ = compare_arrays("s", np.array(["a", "b"]), np.array(["a", "c"]), Criterion())
    assert differ.exceeds and differ.mismatched == 1
    shape = compare_arrays("s", np.array(["a", "b"]), np.array(["a"]), Criterion())
    assert shape.exceeds


def test_an_interrupted_index_write_leaves_no_half_index(tmp_path, monkeypatch):
    import reprokit.engine.activations
    from reprokit.api import make_oracle
    from reprokit.engine.activations import ActivationStore
    from reprokit.graph.io import save_model
    from reprokit.graph.model import mark_outputs

    model = sm.pair_chain(length=4, first=1, second=2)
    oracle = make_oracle("emulate:fp16", RunOptions(), str(tmp_path / "calls"))
    feeds = {"x": np.ones((1, 8), np.float32)}
    names = ["t00", "t01"]

    def run_chunk(chunk):
        return oracle.run_reference(save_model(mark_outputs(model, chunk), str(tmp_path / "c.onnx")), feeds, chunk)

    real_dump = json.dump

    def disk_full(obj, handle, **kwargs):
        if ActivationStore.INDEX not in os.path.basename(getattr(handle, "name", "")):
            return real_dump(obj, handle, **kwargs)  # the worker's job files are not the point
        handle.write('{"t00": "a0000')  # part of the index reached the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reprokit.engine.activations.json, "dump", disk_full)
    folder = tmp_path / "activations"
    with pytest.raises(OSError, match="No space left"):
        ActivationStore.capture(run_chunk, names, {}, str(folder), chunk_bytes=1 << 20)
    assert not (folder / ActivationStore.INDEX).exists()  # --resume recaptures instead of failing
    monkeypatch.undo()
    store = ActivationStore.capture(run_chunk, names, {}, str(folder), chunk_bytes=1 << 20)
    assert set(ActivationStore.open(str(folder))._files) == set(names) and "t01" in store


def test_the_rerun_command_names_the_users_target_not_the_private_timing_cache(tmp_path):
    from reprokit.shrink.steps import _with_timing_cache, rerun_command

    state = str(tmp_path / "out" / ".reprokit")
    injected = _with_timing_cache("trt:fp16", state)
    assert "timing-cache=" in injected
    command = rerun_command("m.onnx", injected, RunOptions())
    assert "timing-cache" not in command and state not in command
    assert "--target trt:fp16 " in command
    own = rerun_command("m.onnx", "trt:fp16,timing-cache=/my/cache", RunOptions())
    assert "timing-cache=/my/cache" in own  # the user's own cache is part of their command


def fp16_layernorm_model():
    """A decomposed LayerNorm in fp16, with fp16 gamma and beta."""
    # x[2,8] f16 -> ReduceMean -> Sub -> Pow 2 -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul g -> Add b -> y
    F16 = TensorProto.FLOAT16

    def c(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float16), name)

    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], name="ln/mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="ln/sub"),
        helper.make_node("Pow", ["d", "two"], ["sq"], name="ln/pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], name="ln/var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
        helper.make_node("Div", ["d", "sd"], ["n"], name="ln/div"),
        helper.make_node("Mul", ["n", "g"], ["m"], name="ln/mul"),
        helper.make_node("Add", ["m", "b"], ["y"], name="ln/bias"),
    ]
    graph = helper.make_graph(
        nodes, "ln", [helper.make_tensor_value_info("x", F16, [2, 8])], [helper.make_tensor_value_info("y", F16, [2, 8])],
        [c("two", 2.0), c("eps", 1e-5), c("g", np.linspace(0.5, 1.5, 8)), c("b", np.linspace(-1, 1, 8))],
    )
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def test_layernorm_fusion_of_an_fp16_model_runs_in_onnxruntime():
    import onnxruntime as ort

    from reprokit.audit.layernorm import fuse_layernorms

    model = fp16_layernorm_model()
    fused, matches = fuse_layernorms(model)
    assert len(matches) == 1 and matches[0].affine
    kinds = {t.name: t.data_type for t in fused.graph.initializer}
    assert kinds[f"{matches[0].fused}.scale"] == TensorProto.FLOAT16
    assert kinds[f"{matches[0].fused}.bias"] == TensorProto.FLOAT16
    x = np.random.default_rng(0).uniform(-2, 2, (2, 8)).astype(np.float16)

    def run(m):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    np.testing.assert_allclose(run(fused).astype(np.float32), run(model).astype(np.float32), atol=2e-2)
