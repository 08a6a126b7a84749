"""The archive step's tools tell their engine time (issue 39, the bookkeeping slice): pack's own
runs of the bundled repro.py and of polygraphy's ``run --onnxrt`` record when their engines ran
(``REPROKIT_ENGINE_TIMES``), so summary.json counts those seconds as engine time and only the
rest of the wait (interpreters, imports, loading) as reprokit's own; polygraphy's runs start
before pack's check, and run on the very file and feeds the archive holds.

Every test here but the dropped-early-runs guard fails on the tree before this change (b2e27f8):
PackResult had no ``tool_engine_seconds``, summary.json no ``pack_tool_engine_seconds``,
repro.py recorded nothing, polygraphy's runs started after the check, and reprorun had no
reader of the times. The guard (float64 feeds) passes there too: it proves the new early start
never leaves the archive's logs run on other feeds than it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import onnx
import pytest
from conftest import extract_data, run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine.session import RunOptions
from reprokit.report.bundle import pack
from reprokit.standalone.arrays import save_npz


def overflow_model():
    """x[2,8] → Mul(a: 300) → Mul(b: 300) → y: 9e4·x overflows fp16 (65,504) for x in [1, 2],
    where fp32 holds it."""
    a = numpy_helper.from_array(np.full((1, 8), 300.0, np.float32), "a")
    b = numpy_helper.from_array(np.full((1, 8), 300.0, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["m"], name="scale_a"),
         helper.make_node("Mul", ["m", "b"], ["y"], name="scale_b")],
        "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [a, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tooltimes")
    path = str(folder / "m.onnx")
    onnx.save(overflow_model(), path)
    x = np.random.default_rng(0).uniform(1.0, 2.0, (2, 8))
    save_npz(str(folder / "x.npz"), {"x": x.astype(np.float32)})
    save_npz(str(folder / "x64.npz"), {"x": x})  # float64: the check casts it to the model's float32
    return folder, path


def _member(archive: str, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        found = next(m for m in tar.getmembers() if m.name.endswith("/" + name))
        return tar.extractfile(found).read()


def test_pack_counts_the_engine_runs_inside_its_tools(files):
    """Of the wait for repro.py and polygraphy, the seconds an engine ran in them are measured
    (more than zero: both run onnxruntime) and never more than the wait itself; polygraphy's log
    is its own run's, under the command as printed."""
    folder, path = files
    events: list[str] = []
    packed = pack(path, "emulate:fp16", str(folder / "a.tar.gz"), on_event=events.append,
                  options=RunOptions(inputs=str(folder / "x.npz")))
    assert packed.reproduces
    assert 0 < packed.tool_engine_seconds <= packed.tool_seconds + 1e-3, (packed.tool_engine_seconds,
                                                                           packed.tool_seconds)
    log = _member(packed.archive, "logs/polygraphy_run_onnxrt.log").decode()
    assert log.startswith("$ polygraphy run model.onnx --onnxrt --load-inputs inputs.json\n"), log[:200]
    assert "onnxrt-runner" in log and log.rstrip().endswith("[exit code 0]"), log[-400:]
    # started before the check: they need neither its verdict nor its files; their logs/ are
    # named once the archive keeps them (a pack that ends with exit 6 writes none)
    started = next(i for i, e in enumerate(events) if e.startswith("started beside the check: polygraphy"))
    assert started < next(i for i, e in enumerate(events) if e.startswith("checking")), events
    named = next(i for i, e in enumerate(events) if e.startswith("logs/polygraphy_run_onnxrt.log"))
    assert named > next(i for i, e in enumerate(events) if e.startswith("writing the bundle")), events


def test_early_polygraphy_runs_are_dropped_when_the_check_used_other_feeds(files):
    """A float64 .npz is cast to the model's float32 by the check: the early runs read the file
    as given, so they are dropped and polygraphy runs on the feeds the archive holds."""
    folder, path = files
    packed = pack(path, "emulate:fp16", str(folder / "b.tar.gz"), options=RunOptions(inputs=str(folder / "x64.npz")))
    assert packed.reproduces
    held = json.loads(_member(packed.archive, "inputs.json"))
    assert len(held) == 1 and set(held[0]) == {"x"}
    import base64
    import io

    x = np.load(io.BytesIO(base64.b64decode(held[0]["x"]["array"])), allow_pickle=False)
    assert x.dtype == np.float32, x.dtype
    assert _member(packed.archive, "logs/polygraphy_run_onnxrt.log").decode().rstrip().endswith("[exit code 0]")
    # the converted model is the same whether it was made early (from the file, beside the check)
    # or again from the checked model
    early = pack(path, "emulate:fp16", str(folder / "b2.tar.gz"), options=RunOptions(inputs=str(folder / "x.npz")))
    assert _member(early.archive, "model.fp16.onnx") == _member(packed.archive, "model.fp16.onnx")


def test_shrink_summary_counts_the_tools_engine_seconds_as_engine_time(files, tmp_path):
    folder, path = files
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "--inputs", str(folder / "x.npz"), "-o", str(out),
                   "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    resources = summary["resources"]
    assert summary["report_reproduces"], summary
    assert 0 < resources["pack_tool_engine_seconds"] <= resources["pack_tool_seconds"] + 1e-3, resources
    assert resources["engine_seconds"] >= (summary["calls"]["target_seconds"] + resources["pack_engine_seconds"]
                                           + resources["pack_tool_engine_seconds"] - 0.003), resources


def test_the_bundled_repro_py_records_its_engine_runs_only_when_asked(files, tmp_path):
    folder, path = files
    packed = pack(path, "emulate:fp16", str(folder / "c.tar.gz"), options=RunOptions(inputs=str(folder / "x.npz")))
    with tarfile.open(packed.archive) as tar:
        extract_data(tar, tmp_path)
    stage = next(p for p in tmp_path.iterdir() if p.is_dir())
    times = tmp_path / "times.txt"
    env = {**os.environ, "REPROKIT_ENGINE_TIMES": str(times)}
    ran = subprocess.run([sys.executable, "repro.py"], cwd=stage, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 1 and "REPRODUCES" in ran.stdout, ran.stdout + ran.stderr
    assert times.exists(), "repro.py recorded nothing"
    runs = [tuple(float(v) for v in line.split()) for line in times.read_text().splitlines()]
    assert len(runs) == 2, times.read_text()  # onnxruntime's reference, then the emulated target
    assert runs[0][1] <= runs[1][0] and all(b >= a for a, b in runs), runs
    env.pop("REPROKIT_ENGINE_TIMES")
    times.unlink()
    ran = subprocess.run([sys.executable, "repro.py"], cwd=stage, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 1 and not times.exists()


def test_engine_seconds_count_overlapping_runs_once_and_only_within_the_wait():
    from reprokit.report.reprorun import engine_seconds_within

    runs = [(0.0, 4.0), (2.0, 6.0), (8.0, 9.0), (10.0, 20.0), (-5.0, -1.0)]
    # wait 3..12: 3..6 (two runs overlapping, once), 8..9, 10..12
    assert engine_seconds_within(runs, 3.0, 12.0) == pytest.approx(3.0 + 1.0 + 2.0)
    assert engine_seconds_within([], 0.0, 10.0) == 0.0
    assert engine_seconds_within([(1.0, 2.0)], 5.0, 6.0) == 0.0


def test_a_torn_or_foreign_line_in_the_times_file_only_counts_less(tmp_path):
    from reprokit.report.reprorun import read_times

    times = tmp_path / "t"
    times.write_text("1.0 2.0\nnonsense\n3.0\n5.0 4.0\n6.0 7.5\n")
    assert read_times(str(times)) == [(1.0, 2.0), (6.0, 7.5)]
    assert read_times(str(tmp_path / "missing")) == []
