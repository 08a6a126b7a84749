"""A ``--json`` command interrupted during its start-up (Ctrl-C or SIGTERM before ``main`` installs
its handlers: the imports of onnx, numpy, rich — up to a second on a loaded machine) prints its
``reprokit.error/1`` object on stdout like every other failure (docs/exit-codes.md: "with --json a
reprokit.error/1 object is printed on stdout as well"); before, stdout stayed empty and a script's
``json.loads`` of it failed. The real handler, sent the real signal, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_STARTING = """
import os, signal, sys
sys.argv = ["reprokit", "check", "m.onnx", "--target", "emulate:fp16"] + sys.argv[1:]
import reprokit.cli  # installs the start-up handler, as the console script's import does
os.kill(os.getpid(), getattr(signal, sys.argv[-1]))
"""


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_an_interrupt_during_start_up_still_prints_the_json_error(name, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _STARTING, "--json", name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # python -c puts its cwd first on sys.path: run where no reprokit/ folder lies
    )
    assert proc.returncode == 130 and proc.stderr.startswith("Error: interrupted\nHint: "), proc
    said = json.loads(proc.stdout)  # was empty
    assert said == {
        "schema": "reprokit.error/1",
        "error": "interrupted",
        "hint": "nothing was started yet",
        "exit_code": 130,
    }
    plain = subprocess.run(
        [sys.executable, "-c", _STARTING, name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert plain.returncode == 130 and plain.stdout == "", plain  # without --json: stderr only
