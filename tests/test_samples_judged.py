"""Every sample judged (issue 14 item 2): --inputs with several samples — a polygraphy JSON list,
a folder of test_data_set_N folders, an .npz with NAME@N members — under the real fp16 storage
emulator: ``check`` gives a verdict per sample, ``shrink`` reduces on the first failing sample and
judges the minimal model on every other failing one, fed with that sample's own activations.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import run_cli
from models import make, planted_overflow, save, vi
from onnx import helper, numpy_helper

from reprokit.api import RunOptions, check
from reprokit.engine.feedfiles import load_feeds, load_samples
from reprokit.errors import InputError, NothingToReduce
from reprokit.graph.model import input_infos
from reprokit.shrink.steps import shrink


def scaled_overflow() -> onnx.ModelProto:
    """Overflows fp16 only where x > ~65: small samples agree, large ones give inf."""
    return planted_overflow(up=1000.0)


def small(seed=0):
    return np.random.default_rng(seed).uniform(0.0, 1.0, (1, 8)).astype(np.float32)


def large(seed=1):
    return np.random.default_rng(seed).uniform(100.0, 200.0, (1, 8)).astype(np.float32)


@pytest.fixture
def planted(tmp_path):
    return save(scaled_overflow(), tmp_path / "scaled.onnx")


def write_json(path, samples):
    from polygraphy.json import save_json

    save_json(samples, str(path))
    return str(path)


def write_data_sets(folder, samples):
    for k, sample in enumerate(samples):
        data_set = folder / f"test_data_set_{k}"
        data_set.mkdir(parents=True)
        for i, (name, value) in enumerate(sample.items()):
            (data_set / f"input_{i}.pb").write_bytes(numpy_helper.from_array(value, name).SerializeToString())
    return str(folder)


def write_npz(path, samples):
    np.savez(path, **{f"{name}@{k}": value for k, sample in enumerate(samples) for name, value in sample.items()})
    return str(path)


WRITERS = {"json": lambda tmp, s: write_json(tmp / "inputs.json", s),
           "test_data_sets": lambda tmp, s: write_data_sets(tmp / "model_dir", s),
           "npz": lambda tmp, s: write_npz(tmp / "inputs.npz", s)}


# --- loading: each format gives its samples in order, --sample N picks one --------------------


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_each_format_gives_every_sample_in_order(tmp_path, planted, fmt):
    infos = input_infos(onnx.load(planted))
    path = WRITERS[fmt](tmp_path, [{"x": small()}, {"x": large()}, {"x": small(5)}])
    samples = load_samples(path, infos)
    assert [s.source for s in samples] == [f"{path} sample {k}" for k in range(3)]
    for got, want in zip(samples, [small(), large(), small(5)]):
        np.testing.assert_array_equal(got.arrays["x"], want)
    one = load_feeds(path, infos, sample=1)
    np.testing.assert_array_equal(one.arrays["x"], large())
    assert one.notes == [f"{path} has 3 samples; using sample 1 (--sample N picks another)"]


def test_npz_sample_axis_shares_plain_members_and_names_a_missing_one(tmp_path):
    # x[1,8], m[1,8] -> Add -> y: "m" without @N is the same in every sample
    model = make([helper.make_node("Add", ["x", "m"], ["y"])], [vi("x", [1, 8]), vi("m", [1, 8])], [vi("y", [1, 8])])
    infos = input_infos(model)
    path = tmp_path / "shared.npz"
    np.savez(path, **{"x@0": small(), "x@1": large(), "m": small(9)})
    samples = load_samples(str(path), infos)
    assert len(samples) == 2
    np.testing.assert_array_equal(samples[1].arrays["m"], small(9))
    np.savez(path, **{"x@0": small(), "x@2": large(), "m": small(9)})
    with pytest.raises(InputError) as info:
        load_samples(str(path), infos)
    assert info.value.message == f"{path}: sample 1 lacks x@1 (the samples are numbered 0..2 by the members' @N)"


# --- check: one verdict per sample -------------------------------------------------------------


def test_check_judges_each_sample_only_the_second_diverges(tmp_path, planted):
    """The issue's case through the library: sample 0 agrees, sample 1 overflows; the shown
    numbers are sample 1's; --sample 0 still judges sample 0 alone."""
    path = write_json(tmp_path / "inputs.json", [{"x": small()}, {"x": large()}])
    result = check(planted, "emulate:fp16", options=RunOptions(inputs=path))
    assert [(s.index, s.verdict.diverges) for s in result.samples] == [(0, False), (1, True)]
    assert result.samples[1].verdict.signature.describe() == "nonfinite (inf) in y"
    assert result.samples[0].worst()["error"] < 1e-2
    assert result.verdict is result.samples[1].verdict
    np.testing.assert_array_equal(result.prepared.feeds.arrays["x"], large())
    alone = check(planted, "emulate:fp16", options=RunOptions(inputs=path, sample=0))
    assert not alone.verdict.diverges and alone.samples == []


def test_check_cli_reports_each_sample_from_test_data_sets(tmp_path, planted):
    path = write_data_sets(tmp_path / "model_dir", [{"x": small()}, {"x": large()}])
    proc = run_cli("check", planted, "-t", "emulate:fp16", "--inputs", path, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert next(line for line in lines if line.startswith("sample 0:")).startswith("sample 0: agrees; worst y rel-l2 ")
    assert "sample 1: nonfinite (inf) in y; worst y rel-l2 inf" in lines
    assert "DIVERGES (1 of 2 samples diverge; sample 1 shown): nonfinite (inf) in y" in proc.stdout


def test_check_cli_json_lists_each_sample_from_npz(tmp_path, planted):
    path = write_npz(tmp_path / "inputs.npz", [{"x": small()}, {"x": large()}])
    proc = run_cli("check", planted, "-t", "emulate:fp16", "--inputs", path, "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout, parse_constant=lambda token: pytest.fail(f"non-standard JSON {token}"))
    assert [(s["index"], s["diverges"], s["signature"]["kind"], s["worst"]["error"]) for s in data["samples"]][1] == (
        1, True, "nonfinite", "inf")
    assert [s["diverges"] for s in data["samples"]] == [False, True] and data["verdict"]["diverges"] is True


# --- shrink: reduced on the first failing sample, judged on each other failing one --------------


def test_shrink_cli_reproduces_on_the_second_sample_and_says_so(tmp_path, planted):
    """The issue's done-when: a 2-sample input where only sample 1 diverges."""
    path = write_json(tmp_path / "inputs.json", [{"x": small()}, {"x": large()}])
    proc = run_cli("shrink", planted, "-t", "emulate:fp16", "--inputs", path, "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "done" and summary["minimal"]["node_names"] == ["boom"]
    rows = [(s["index"], s["diverged_originally"], s["reduced_on"], s["reproduces"]) for s in summary["samples"]]
    assert rows == [(0, False, False, None), (1, True, True, True)]
    assert "the minimal model reproduces nonfinite on sample 1 of the 2" in proc.stdout
    import tarfile

    with tarfile.open(tmp_path / "out" / "report.tar.gz") as archive:
        issue = next(m for m in archive.getmembers() if m.name.endswith("ISSUE.md"))
        text = archive.extractfile(issue).read().decode()
    assert ("The inputs hold 2 samples; on the original model sample 1 diverges and the others agree. The model "
            "was reduced on sample 1 (the attached inputs), and the minimal model reproduces on sample 1, each fed "
            "with its own activations.") in text


def test_shrink_judges_the_minimal_on_each_other_failing_sample(tmp_path, planted):
    """Samples 1 and 2 overflow: reduced on 1; the minimal judged on sample 2 with sample 2's
    own activation at its cut (a = x + 0.5 of sample 2), one more target call."""
    path = write_npz(tmp_path / "three.npz", [{"x": small()}, {"x": large()}, {"x": large(7)}])
    result = shrink(planted, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=path))
    rows = {s["index"]: s for s in result.summary["samples"]}
    assert [rows[k]["diverged_originally"] for k in range(3)] == [False, True, True]
    assert rows[1]["reduced_on"] and rows[1]["reproduces"] is True
    assert rows[2]["reproduces"] is True and rows[2]["same_model"] is True
    assert rows[2]["minimal_signature"]["kind"] == "nonfinite" and rows[0]["reproduces"] is None
    step = next(s for s in result.summary["steps"] if s["step"] == "samples")
    assert step["calls"] == 1
    # the minimal's feed on sample 1 is sample 1's activation at the cut
    np.testing.assert_allclose(np.load(tmp_path / "out" / "inputs.npz")["a"], large() + 0.5)
    assert any("reproduces nonfinite on samples 1, 2 of the 3" in note for note in result.notes)


def test_shrink_with_no_failing_sample_stops_naming_each(tmp_path, planted):
    path = write_npz(tmp_path / "ok.npz", [{"x": small()}, {"x": small(3)}])
    with pytest.raises(NothingToReduce) as info:
        shrink(planted, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=path))
    assert info.value.message.startswith("none of the 2 input samples diverges under emulate:fp16 (rel-l2 <= 0.01): "
                                         "sample 0: agrees; worst y rel-l2 ")
