"""What a pass/fail check command's run spends besides its search on a small model (issue 39: wall
at most polygraphy's, search calls at most polygraphy's on its toy pairs): the confirming call
runs beside the reference capture; a union of members is asked alone, its pack's answer never
taken for it (a coin more for a flaky check).

Every check here is a real ``cmd:`` script that logs each call (the node names it was given,
or the time it started), so what reprokit says it did is checked against what the check saw.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import shrink_models as sm
from onnx import TensorProto, helper, numpy_helper

from reprokit.errors import ReferenceFailure
from reprokit.shrink.steps import shrink

PY = sys.executable

# Fails (exit 1) while every name in FAIL is a node of the model; logs the names of each model.
NAMES_CHECK = """
import sys
import onnx
names = [n.name for n in onnx.load(sys.argv[1]).graph.node]
with open({log!r}, "a") as handle:
    handle.write(",".join(sorted(names)) + "\\n")
if set({fail!r}) <= set(names):
    print("[E] engine build failed")
    sys.exit(1)
"""


def reducable():
    """polygraphy's reducable model: x0 → n1 ─┐            ┌→ n7 → z1
                                              n5 (Add) → z0 ┤
                                 y0 → n3 ─┘            └→ n9 → z2"""
    nodes = [helper.make_node("Identity", ["x0"], ["x1"], name="n1"),
             helper.make_node("Identity", ["y0"], ["y1"], name="n3"),
             helper.make_node("Add", ["x1", "y1"], ["z0"], name="n5"),
             helper.make_node("Identity", ["z0"], ["z1"], name="n7"),
             helper.make_node("Identity", ["z0"], ["z2"], name="n9")]
    return sm.make(nodes, [sm.vi("x0", [1]), sm.vi("y0", [1])], [sm.vi("z1", [1]), sm.vi("z2", [1])])


def _run(tmp_path, fail: list[str]):
    path = sm.save(reducable(), tmp_path / "m.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", NAMES_CHECK.format(log=str(log), fail=fail))
    summary = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), shrink_shapes=False).summary
    return summary, [line.split(",") for line in log.read_text().splitlines()]


def test_the_union_is_asked_alone_even_where_its_pack_was_that_model(tmp_path):
    """n1 and n3 fail only together. Their survey pack [n1, n3] is the model of their union
    itself (they read nothing of each other and no tensor in common), yet the union is asked
    alone before it is kept: a check failing at random gives this very answer sequence (F, F, P,
    P, …), and taking the pack's answer for the union raised its odds of ending "done" with a
    reduced model from 6.455% to 6.687% (bench/flaky_tree.py, every answer sequence walked;
    docs/benchmark.md). So polygraphy's toy pair costs 4 search calls here, polygraphy 3:
    confirm; the pack, n1, n3, the union; the result three times fresh."""
    summary, calls = _run(tmp_path, ["n1", "n3"])
    assert summary["minimal"]["node_names"] == ["n1", "n3"] and summary["one_minimal"]
    assert calls == [["n1", "n3", "n5", "n7", "n9"], ["n1", "n3"], ["n1"], ["n3"]] + [["n1", "n3"]] * 4, calls
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert steps == {"confirm": 1, "survey": 4, "final": 3}, steps


def test_members_reading_one_tensor_are_asked_as_their_union(tmp_path):
    """n7 and n9 both read z0: a pack gives each its own copy of z0, their union reads one — not
    the same model, so the union is asked alone in the search (and then three times in the
    final judgement, the calibration sparing none of them: two after it)."""
    summary, calls = _run(tmp_path, ["n7", "n9"])
    assert summary["minimal"]["node_names"] == ["n7", "n9"] and summary["one_minimal"]
    survey_calls = calls[:-2]
    assert survey_calls.count(["n7", "n9"]) == 1, calls  # the union alone, in the search
    assert calls[-2:] == [["n7", "n9"]] * 2, calls


# Logs when it started (before any import), then fails while n5 is in the model.
TIMED_CHECK = """
import time
started = time.time()
import sys
import onnx
with open({log!r}, "a") as handle:
    handle.write(f"{{started}}\\n")
if "n5" in {{n.name for n in onnx.load(sys.argv[1]).graph.node}}:
    sys.exit(1)
"""


def test_the_confirming_call_runs_beside_the_capture(tmp_path):
    """A pass/fail check reads no reference value: the original's call starts before the
    reference capture ends (the capture's index is written last), and is still the run's one
    confirming call. Before, it started only after the capture."""
    path = sm.save(reducable(), tmp_path / "m.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", TIMED_CHECK.format(log=str(log)))
    events = []
    summary = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), shrink_shapes=False,
                     on_event=events.append).summary
    assert summary["minimal"]["node_names"] == ["n5"]
    starts = [float(line) for line in log.read_text().splitlines()]
    captured = os.path.getmtime(tmp_path / "out" / ".reprokit" / "activations" / "index.json")
    assert starts[0] < captured, (starts[0], captured)
    assert all(start > captured for start in starts[1:]), (starts, captured)
    assert summary["original_confirmed"].startswith("a call of its own, beside the reference capture")
    assert {s["step"]: s["calls"] for s in summary["steps"]}["confirm"] == 1
    assert summary["calls"]["target"] == len(starts)
    assert events.index(next(e for e in events if "beside the capture" in e)) < events.index(
        "capturing reference activations: done"), events


# Writes its pid, then takes its time; fails.
SLOW_CHECK = """
import os, sys, time
with open({pid!r}, "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(60)
sys.exit(1)
"""


def test_a_failing_capture_takes_the_confirming_call_with_it(tmp_path):
    """x[4] → Gather(index 7) → y: onnxruntime refuses the index at run time, so the capture
    fails while the check (slow) is judging the original beside it. The run stops with the
    reference's error and the check's process is gone: no call outlives its run."""
    index = numpy_helper.from_array(__import__("numpy").array([7], dtype="int64"), "idx")
    model = sm.make([helper.make_node("Gather", ["x", "idx"], ["y"], name="g0", axis=0)],
                    [sm.vi("x", [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [index])
    path = sm.save(model, tmp_path / "m.onnx")
    pid = tmp_path / "check.pid"
    script = sm.write_script(tmp_path, "check.py", SLOW_CHECK.format(pid=str(pid)))
    with pytest.raises(ReferenceFailure):
        shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), shrink_shapes=False)
    assert pid.exists(), "the check never started beside the capture"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.read_text()), 0)
    assert not (tmp_path / "out" / "summary.json").exists() or json.loads(
        (tmp_path / "out" / "summary.json").read_text())["status"] != "done"

