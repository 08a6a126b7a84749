"""The suite's own parallel run (.ci/run: ``pytest -n 2``): conftest's scheduler hook sends a
whole test file to one pytest-xdist worker, so a file's module-scoped fixture (a shrink, a pack, an
export) is built once, not once per worker (xdist's own default deals a file's tests out to every
worker). Proved on a throwaway suite of two files, run for real with two workers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# this run's own settings stay out (a worker of this suite carries PYTEST_XDIST_WORKER)
OUTSIDE = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

FILE = """
import os

import pytest


@pytest.fixture(scope="module")
def built():
    # one line per build: this file's name and the worker that built it
    with open(os.environ["BUILDS_LOG"], "a") as handle:
        handle.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("k", range(4))
def test_uses_the_fixture(built, k):
    pass
"""

CONFTEST = f"""
import importlib.util

spec = importlib.util.spec_from_file_location("suite_conftest", {str(HERE / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
globals().update({{k: v for k, v in vars(suite).items() if k.startswith("pytest_xdist_")}})
"""


def _builds(tmp_path: Path) -> list[str]:
    """Run the two-file suite with two workers; the module fixture's builds, one line each."""
    log = tmp_path / "builds.log"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"],
        cwd=tmp_path / "suite",
        capture_output=True,
        text=True,
        timeout=300,
        env={**OUTSIDE, "BUILDS_LOG": str(log)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout, done.stdout
    return sorted(log.read_text().splitlines())


def test_two_workers_take_whole_files_and_build_each_module_fixture_once(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: pip install -e '.[test]'")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("test_first.py", "test_second.py"):
        (suite / name).write_text(FILE)
    builds = _builds(tmp_path)
    assert [line.split()[0] for line in builds] == ["test_first", "test_second"], builds
