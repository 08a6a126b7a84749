"""The matrix wing's pure parts (issue 27): --versions grammar, the bisect search (a fake
outcome function over release names: a pure algorithm test, named as such), ISSUE.md's answer,
and the command line's usage errors. Real environments and Ray: tests/test_matrix_envs.py."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from click.testing import CliRunner

from reprokit.cli import cli
from reprokit.errors import UsageError
from reprokit.matrix.bisect import bisect
from reprokit.matrix.specs import Release, choose, parse_versions
from reprokit.matrix.table import answer_in_issue


def test_parse_pins_and_ranges():
    spec = parse_versions("onnxruntime==1.18.1,1.20.1,latest")
    assert (spec.package, spec.pins, spec.engine) == ("onnxruntime", ("1.18.1", "1.20.1", "latest"), "ort")
    assert parse_versions("openvino>=2024.0").range == ">=2024.0"
    assert parse_versions("tensorrt-cu12==10.0.*,10.13.*").pins == ("10.0.*", "10.13.*")
    assert parse_versions("onnxruntime").range == ""  # every release


@pytest.mark.parametrize("text", ["numpy==1.0", "onnxruntime==", "onnxruntime==1.2,x y", "onnxruntime>=>=1",
                                  "==1.0", "onnxruntime==1.2x", "onnxruntime==1.26.0,1.2.*.*"])
def test_parse_refuses(text):
    with pytest.raises(UsageError):
        parse_versions(text)


RELEASES = [Release(v, None) for v in ["1.26.0", "1.27.0", "1.28.0", "1.29.0", "1.29.1", "1.30.0"]]


def test_choose_pins_wildcards_latest_and_ranges():
    assert [r.version for r in choose(parse_versions("onnxruntime==1.29.*,latest,1.27.0"), RELEASES)] == [
        "1.27.0", "1.29.1", "1.30.0"]
    assert [r.version for r in choose(parse_versions("onnxruntime>=1.28,<1.30"), RELEASES)] == [
        "1.28.0", "1.29.0", "1.29.1"]
    with pytest.raises(UsageError, match="1.25.0 is not on the index"):
        choose(parse_versions("onnxruntime==1.25.0"), RELEASES)


def test_releases_from_an_index_page():
    """Wheels for this interpreter count, a release of foreign wheels does not, an sdist alone does
    (TensorRT's packages), yanked files and pre-releases do not."""
    from packaging.tags import sys_tags

    from reprokit.matrix.specs import releases_from

    tag = next(iter(sys_tags()))
    here = f"{tag.interpreter}-{tag.abi}-{tag.platform}"
    files = [{"filename": f"eng-1.0.0-{here}.whl", "upload-time": "2026-01-02T00:00:00Z"},
             {"filename": "eng-1.0.0.tar.gz", "upload-time": "2026-01-01T00:00:00Z"},
             {"filename": "eng-1.1.0-cp27-cp27m-win32.whl"}, {"filename": "eng-1.1.0.tar.gz"},
             {"filename": "eng-1.2.0.tar.gz", "upload-time": "2026-03-01T00:00:00Z"},
             {"filename": f"eng-1.3.0-{here}.whl", "yanked": True},
             {"filename": f"eng-1.4.0rc1-{here}.whl"}]
    assert releases_from({"files": files}) == [Release("1.0.0", "2026-01-02T00:00:00Z"),
                                               Release("1.2.0", "2026-03-01T00:00:00Z")]


def _fake_judge(first_fixed: int, cannot: frozenset = frozenset()):
    """Pure algorithm test: release i reproduces below ``first_fixed``; ``cannot`` cannot run."""
    calls = []

    def judge(versions):
        calls.extend(versions)
        return {v: "cannot run" if int(v) in cannot else ("reproduces" if int(v) < first_fixed else "does not reproduce")
                for v in versions}
    return judge, calls


@pytest.mark.parametrize("n,fixed", [(2, 1), (5, 3), (13, 7), (23, 22), (23, 1), (64, 40)])
def test_bisect_finds_the_first_fixed_release_in_log2_steps(n, fixed):
    versions = [str(i) for i in range(n)]
    judge, calls = _fake_judge(fixed)
    found = bisect(versions, judge)
    assert [(b.before, b.after, b.kind) for b in found.boundaries] == [(str(fixed - 1), str(fixed), "fixed")]
    assert found.environments == len(calls) == len(set(calls)) <= 2 + math.ceil(math.log2(n - 1)) if n > 2 else 2


def test_bisect_known_point_saves_an_environment_and_skips_what_cannot_run():
    versions = [str(i) for i in range(16)]
    judge, calls = _fake_judge(9, cannot=frozenset({8, 10}))
    found = bisect(versions, judge, known={"4": "reproduces"})
    assert "4" not in calls
    # 8 cannot run: the boundary is between the releases that could
    assert [(b.before, b.after) for b in found.boundaries] == [("7", "9")]


def test_bisect_without_a_change_says_so():
    judge, _ = _fake_judge(100)
    found = bisect([str(i) for i in range(8)], judge)
    assert not found.boundaries and "reproduces at every release judged" in found.note


def test_issue_answer_replaces_the_latest_release_section():
    issue = "# T\n\n## Have you tried [the latest release](x)?\n\nNot run.\n\n## Can this model run elsewhere?\n\nYes.\n"
    out = answer_in_issue(issue, "Yes: the table.")
    assert "Not run." not in out and "Yes: the table." in out and out.endswith("## Can this model run elsewhere?\n\nYes.\n")
    assert answer_in_issue("# T\n", "A.").endswith("## Where it reproduces (engine versions)\n\nA.\n")


@pytest.mark.parametrize("args,message", [
    (["--bisect"], "go with --versions"),
    (["--versions", "numpy==1.0"], "not an engine package"),
    (["--versions", "onnxruntime==1.28.0", "--bisect", "--gpus", "L4,A100"], "one GPU kind at a time"),
    (["--versions", "onnxruntime==1.28.0", "--gpus", "L4"], "GPU kinds of a Ray cluster"),
    (["--versions", "onnxruntime>=>=1"], "not a version range"),
    (["--versions", "onnxruntime==1.2x"], "'1.2x' is not a version"),
    (["--versions", "onnxruntime==1.28.0", "--target", "bogus"], "unknown engine 'bogus'"),
    (["--versions", "onnxruntime==1.28.0", "--ray", "nonsense"], "is not an address"),
])
def test_verify_versions_usage_errors(tmp_path, args, message):
    archive = tmp_path / "report.tar.gz"
    archive.write_bytes(b"")
    done = subprocess.run([sys.executable, "-m", "reprokit", "verify", str(archive), *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_missing_archive_is_an_input_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "reprokit", "verify", str(tmp_path / "nothere.tar.gz"), "--versions",
                           "onnxruntime==1.27.0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "archive not found" in done.stderr and "Traceback" not in done.stderr


def test_verify_help_names_versions():
    assert "--versions" in CliRunner().invoke(cli, ["verify", "--help"]).output


def test_without_uv_the_matrix_says_what_to_install(monkeypatch, tmp_path):
    """Exit 4 (environment) and the extra to install, before any archive is read."""
    from reprokit.errors import EngineUnavailable, ExitCode
    from reprokit.matrix import run

    monkeypatch.setattr(run, "find_uv", lambda: None)
    (tmp_path / "report.tar.gz").write_bytes(b"")
    with pytest.raises(EngineUnavailable) as caught:
        run.verify_versions(str(tmp_path / "report.tar.gz"), "onnxruntime==1.27.0")
    assert caught.value.exit_code == ExitCode.ENVIRONMENT and "reprokit[matrix]" in caught.value.hint


def test_the_matrix_answers_nothing_when_no_cell_ran_or_bisect_judged_one_release():
    """The rule behind exit 9, on rows as the cells return them: a table whose every run cell
    "cannot run" (a known packed-with row does not count as run), and a bisect with fewer than two
    judged releases, answer nothing; one judged cell, or a bisect over two, does."""
    from reprokit.matrix.bisect import BisectResult
    from reprokit.matrix.run import _no_answer

    cannot = {"version": "1.0.0", "outcome": "cannot run", "why": "environment: uv pip install failed"}
    known = {"version": "1.1.0", "outcome": "reproduces", "known": True}
    ran = {"version": "1.2.0", "outcome": "does not reproduce"}
    assert _no_answer([cannot], None)[0] == "no-cell-ran"
    assert _no_answer([cannot, known], None)[0] == "no-cell-ran"
    assert _no_answer([cannot, ran], None) is None
    one = BisectResult(["1.0.0", "1.1.0", "1.2.0"], {"1.0.0": "cannot run", "1.2.0": "does not reproduce"})
    assert _no_answer([cannot, ran], one) == ("bisect-inconclusive", "--bisect judged 1 of 3 releases (the others "
                                              "cannot run): no boundary to search")
    two = BisectResult(["1.0.0", "1.1.0", "1.2.0"], {"1.1.0": "reproduces", "1.2.0": "does not reproduce"})
    assert _no_answer([known, ran], two) is None


def test_exit_9_is_documented():
    from reprokit.errors import ExitCode, MatrixNoAnswer

    assert MatrixNoAnswer("x").exit_code == ExitCode.NO_ANSWER == 9
    assert "9 when none could" in " ".join(CliRunner().invoke(cli, ["verify", "--help"]).output.split())
    from pathlib import Path

    root = Path(__file__).parent.parent
    assert "| 9 | `verify --versions`" in (root / "README.md").read_text()
    assert "| 9 | the matrix answers nothing" in (root / "docs" / "matrix.md").read_text()


def test_a_ray_address_nobody_listens_on_is_exit_4_at_once(tmp_path):
    """ray.init would retry for minutes, printing its own log lines; reprokit asks the port first."""
    import socket
    import time

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    archive = tmp_path / "report.tar.gz"
    archive.write_bytes(b"")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "reprokit", "verify", str(archive), "--versions",
                           "onnxruntime==1.28.0", "--ray", f"127.0.0.1:{port}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 4, done.stderr
    assert f"Error: cannot reach the Ray cluster at '127.0.0.1:{port}'" in done.stderr and "Hint:" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 60
