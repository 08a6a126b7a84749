"""engine/tensorfile's job feeds: a call's feeds that are views of the captured activations (a
stable tensor file) cross to the worker by reference, not copied into its .npz (issue 39: a Swin
survey pack's ~800 MB of feeds, ~2 s of reprokit's own time a run); the worker gets the same
arrays, in the same order, writable, as from the .npz."""

from __future__ import annotations

import os
import zipfile

import numpy as np

from reprokit.engine.tensorfile import TensorFile, load_job_feeds, save_job_feeds, write_tensors


def test_views_of_stable_files_go_by_reference_and_come_back_equal(tmp_path):
    rng = np.random.default_rng(0)
    captured = {
        "act/a": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "act/b": np.arange(7, dtype=np.int64),
    }
    entries = write_tensors(str(tmp_path / "capture.bin"), captured.items())
    stable = TensorFile(str(tmp_path / "capture.bin"), stable=True)
    other = str(tmp_path / "outputs.bin")
    y_entry = write_tensors(other, [("y", np.ones(5, np.float32))])["y"]
    loose = TensorFile(
        other
    )  # a call's outputs: deleted when the call is discarded, never referenced
    feeds = {
        "pixel_values": rng.standard_normal((1, 3)).astype(
            np.float32
        ),  # the user's input, in memory
        "act/a": stable.view(entries["act/a"]),
        "act/b": stable.view(entries["act/b"]),
        "act/a sliced": stable.view(entries["act/a"])[:, ::2],  # not contiguous: copied
        "y": loose.view(y_entry),
    }
    path = save_job_feeds(str(tmp_path / "feeds.npz"), feeds)
    with zipfile.ZipFile(path) as archive:
        stored = sorted(name[: -len(".npy")] for name in archive.namelist())
    assert stored == ["act/a sliced", "pixel_values", "y"]
    back = load_job_feeds(path)
    assert list(back) == list(feeds)
    for name, value in feeds.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        np.testing.assert_array_equal(back[name], value)
        assert back[name].flags.writeable
    os.remove(
        tmp_path / "capture.bin"
    )  # gone (the run's end): copied again, never a dangling reference
    path = save_job_feeds(str(tmp_path / "again.npz"), {"act/b": np.arange(7, dtype=np.int64)})
    assert not os.path.exists(path + ".refs.json")
    np.testing.assert_array_equal(load_job_feeds(path)["act/b"], np.arange(7))


def test_an_oracle_sums_a_captured_reference_once(tmp_path, monkeypatch):
    """The survey's reference tensors are judged again in every later pack: their sums are
    computed once per run (keyed by their place in the stable capture file)."""
    from reprokit.engine import oracle as oracle_module
    from reprokit.engine.oracle import Oracle
    from reprokit.engine.worker import WorkerResult
    from reprokit.standalone.compare import Criterion

    rng = np.random.default_rng(2)
    value = rng.standard_normal((64, 64)).astype(np.float32)
    entries = write_tensors(str(tmp_path / "capture.bin"), [("h", value)])
    stable = TensorFile(str(tmp_path / "capture.bin"), stable=True)
    counted = []
    real = oracle_module.reference_sums
    monkeypatch.setattr(oracle_module, "reference_sums", lambda r: counted.append(1) or real(r))
    oracle = Oracle(
        "ort",
        "emulate:fp16",
        Criterion(tolerance=1e-2),
        precision="fp16",
        workdir=str(tmp_path / "w"),
    )
    verdicts = []
    for scale in (1.001, 1.5, 1.001):
        result = WorkerResult("ok", outputs={"h": (value * scale).astype(np.float32)})
        verdicts.append(oracle.verdict_from(result, {"h": stable.view(entries["h"])}, full=False))
    assert [v.diverges for v in verdicts] == [False, True, False]
    assert len(counted) == 1
    loose = {"h": value.copy()}  # not a view of a stable file: never kept
    oracle.verdict_from(WorkerResult("ok", outputs={"h": value}), loose, full=False)
    assert len(counted) == 1
