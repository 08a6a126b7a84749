"""Issue 28, items 2 and 3: ``run.json`` records every option of a shrink run and ``--resume``
restores them all (a resumed run packs no archive the user said not to, searches as it was told);
a finished run resumed says so and keeps its result byte for byte; ``shrink --audit`` on several
input samples audits the sample the run reduced on, not sample 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_user_error, run_cli
from models import matmul_overflow, planted_overflow, save

from reprokit.errors import InputError, NothingRemoved
from reprokit.shrink.budget import Limits
from reprokit.shrink.steps import shrink
from reprokit.standalone.arrays import save_npz

OWN_OPTIONS = ["--no-pack", "--one-by-one", "--no-shrink-shapes", "--search-accumulated", "--replays", "0",
               "--no-localize", "--accept-milder"]


def resume_args(out) -> list[str]:
    return json.loads((out / ".reprokit" / "run.json").read_text())["resume"]["args"]


def test_resume_restores_every_option_and_keeps_a_finished_result(tmp_path):
    # x[1,8] -> Add "pre" -> Mul(1e5) "boom" (inf in fp16) -> Mul "back" -> Relu "post" -> y
    save(planted_overflow(), tmp_path / "planted.onnx")
    out = tmp_path / "out"
    # 4 target calls: the confirming one, two for the search (stops at 2 of 4 nodes), the result alone
    first = run_cli("shrink", "planted.onnx", "-t", "emulate:fp16", "--max-calls", "4", *OWN_OPTIONS, "-o", "out",
                    cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["budget"]["stopped"]
    saved = " ".join(resume_args(out))
    for option in ("--no-pack", "--one-by-one", "--no-shrink-shapes", "--search-accumulated", "--replays 0",
                   "--no-localize", "--accept-milder", "--max-calls 4"):
        assert option in saved, saved

    # --resume DIR with only a larger budget: every other option comes back from run.json
    again = run_cli("shrink", "--resume", "out", "--max-calls", "0", cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "done" and not summary["budget"]["stopped"]
    assert summary["shapes"] is None  # --no-shrink-shapes held
    assert not (out / "report.tar.gz").exists()  # --no-pack held
    saved = " ".join(resume_args(out))
    assert "--max-calls 0" in saved and "--one-by-one" in saved and "--no-pack" in saved

    # a finished run resumed: said so, nothing rewritten
    kept = {name: (out / name).read_bytes() for name in ("summary.json", "minimal.onnx", "inputs.npz")}
    last = run_cli("shrink", "--resume", "out", cwd=tmp_path, timeout=300)
    assert last.returncode == 0, last.stderr[-3000:]
    assert "finished run" in last.stderr and "kept as it is" in last.stderr
    assert {name: (out / name).read_bytes() for name in kept} == kept


def test_shrink_audit_on_several_samples_audits_the_sample_reduced_on(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y: sample 0 (zeros) agrees, sample 1 (0.9) overflows fp16
    save(matmul_overflow(), tmp_path / "m.onnx")
    save_npz(str(tmp_path / "in.npz"), {"x@0": np.zeros((1, 16), np.float32),
                                        "x@1": np.full((1, 16), 0.9, np.float32)})
    proc = run_cli("shrink", "m.onnx", "--inputs", "in.npz", "-t", "emulate:fp16", "--audit", "--no-pack",
                   "-o", "out", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["index"] for row in summary["samples"] if row["reduced_on"]] == [1]
    audited = json.loads((tmp_path / "out" / "audit" / "audit.json").read_text())
    assert audited["verdict"]["diverges"], audited["verdict"]
    assert audited["verdict"]["signature"]["kind"] == "nonfinite"


def test_resume_refuses_changed_options_and_keeps_a_budget_stopped_runs_activations(tmp_path):
    """Loose ends of issue 25: an option given again on --resume silently replaced the run's own
    (--one-by-one, --tol: the journal's verdicts were made without them); a run stopped by its
    call budget dropped its captured activations, which the --resume its hint prints needs."""
    # x[1,8] -> Add "pre" -> Mul(1e5) "boom" (inf in fp16) -> Mul "back" -> Relu "post" -> y
    save(planted_overflow(), tmp_path / "planted.onnx")
    out = tmp_path / "out"
    first = run_cli("shrink", "planted.onnx", "-t", "emulate:fp16", "--max-calls", "2", "--no-pack", "-o", "out",
                    cwd=tmp_path, timeout=300)
    assert first.returncode in (0, 8), first.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["budget"]["stopped"]
    assert "for --resume (stopped at the call budget)" in first.stderr, first.stderr[-2000:]
    assert any((out / ".reprokit" / "activations").iterdir())

    for given, named in ((["--one-by-one"], "--one-by-one on (the run: off)"), (["--tol", "0.5"], "--tol 0.5"),
                         (["--seed", "3"], "--seed 3 (the run: 0)")):
        proc = run_cli("shrink", "--resume", "out", "--max-calls", "0", *given, cwd=tmp_path, timeout=300)
        error, hint = assert_user_error(proc, 2, contains=named)
        assert "differs from the run being resumed" in error and "--max-calls" in hint, hint
    # plain --resume with the whole command again: the run's fingerprint (search options included)
    proc = run_cli("shrink", "planted.onnx", "-t", "emulate:fp16", "--no-localize", "--no-pack", "-o", "out",
                   "--resume", cwd=tmp_path, timeout=300)
    assert_user_error(proc, 3, contains="differs from the one in out in search")
    # what may change (budget, timeout, replays: the flaky verdict's hint) and the run's own values retyped
    again = run_cli("shrink", "--resume", "out", "--max-calls", "0", "--timeout", "100", "--replays", "1", "--seed", "0",
                    cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "done"
    assert not (out / ".reprokit" / "activations").exists()  # a finished run drops them
    # a finished run resumed with another criterion: refused, not "kept as it is" as if it applied
    proc = run_cli("shrink", "--resume", "out", "--tol", "0.5", cwd=tmp_path, timeout=300)
    assert_user_error(proc, 2, contains="--tol 0.5")


def test_the_resume_fingerprint_covers_the_search_options(tmp_path):
    """Through the Python API (no CLI to refuse it): resuming with other search options is the
    'different run' error, as a changed model or target is."""
    save(planted_overflow(), tmp_path / "planted.onnx")
    out = str(tmp_path / "out")
    with pytest.raises(NothingRemoved):  # the budget stops it before any node goes
        shrink(str(tmp_path / "planted.onnx"), "emulate:fp16", out, limits=Limits(max_calls=2))
    run = json.loads((tmp_path / "out" / ".reprokit" / "run.json").read_text())
    assert run["search"]["pack"] is True and run["search"]["localize"] is True
    with pytest.raises(InputError, match="differs from the one in .* in search"):
        shrink(str(tmp_path / "planted.onnx"), "emulate:fp16", out, limits=Limits(max_calls=0), resume=True,
               pack_candidates=False)
