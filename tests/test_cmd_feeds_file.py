"""Issue 39: a ``cmd:`` check call writes its feeds to ``{inputs}`` only when the command names
``{inputs}`` — a pass/fail check that reads the model alone no longer waits for a pack's feeds
(hundreds of MB on a survey pack of cut activations) to be written before every call."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PY
from models import matmul_overflow, save

from reprokit.engine.backends.base import BuildError
from reprokit.engine.backends.cmd import CmdBackend
from reprokit.spec import parse_target

# argv: MODEL OUTPUTS [INPUTS]. Exit 3 when the call's folder holds a feeds file the command was
# not given; with INPUTS, exit 4 unless it holds the feeds (x of shape [1, 16]).
CHECK = """import os, sys
import numpy as np
folder = os.path.dirname(sys.argv[2])
if len(sys.argv) == 3:
    sys.exit(3 if os.path.exists(os.path.join(folder, "inputs.npz")) else 0)
with np.load(sys.argv[3]) as feeds:
    sys.exit(0 if feeds["x"].shape == (1, 16) else 4)
"""


@pytest.fixture
def case(tmp_path):
    # x[1,16] -> MatMul(3e4) -> y
    model = save(matmul_overflow(), tmp_path / "m.onnx")
    (tmp_path / "check.py").write_text(CHECK)
    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (1, 16)).astype(np.float32)}
    return model, str(tmp_path / "check.py"), feeds


def test_a_check_that_names_no_inputs_gets_no_feeds_file(case):
    model, check, feeds = case
    backend = CmdBackend(parse_target(f"cmd:{PY} {check} {{model}} {{outputs}}"))
    try:
        result = backend.run(model, feeds, ["y"])
    except BuildError as exc:  # exit 3: the feeds were written all the same
        pytest.fail(f"a feeds file was written for a command that does not read it: {exc}")
    assert result.meta["exit_code"] == 0


def test_a_check_that_names_inputs_reads_the_feeds(case):
    model, check, feeds = case
    backend = CmdBackend(parse_target(f"cmd:{PY} {check} {{model}} {{outputs}} {{inputs}}"))
    assert backend.run(model, feeds, ["y"]).meta["exit_code"] == 0
