"""What a pass/fail check command pays outside the search (issue 25): the pack calibration is the
original's replay, the Identity probe runs only when no call of the run passed, the result is
replayed where it was not seen failing enough, and ``--max-calls`` is never exceeded.

Every count here comes from the check itself: a real ``cmd:`` check script that appends one line
per call to a log, so a call reprokit forgot to count would still show.
"""

from __future__ import annotations

import json
import sys

import pytest
import shrink_models as sm
from conftest import run_cli
from onnx import helper

from reprokit.shrink.steps import shrink

PY = sys.executable

# Fails (exit 1) while every name in FAIL is a node of the model; one log line per call.
NAME_CHECK = """
import sys
import onnx
with open({log!r}, "a") as handle:
    handle.write(sys.argv[1] + "\\n")
names = {{n.name for n in onnx.load(sys.argv[1]).graph.node}}
if {fail!r} and set({fail!r}) <= names:
    print({words!r})
    sys.exit(1)
"""



def chain(length: int = 8, shape=(16,)):
    """x → n0 → n1 → … → n{length-1} → y, alternating Relu/Neg/Abs (no op of anyone's bug)."""
    ops = ("Relu", "Neg", "Abs")
    nodes = [helper.make_node(ops[k % 3], ["x" if k == 0 else f"t{k - 1}"],
                              ["y" if k == length - 1 else f"t{k}"], name=f"n{k}") for k in range(length)]
    return sm.make(nodes, [sm.vi("x", list(shape))], [sm.vi("y", list(shape))])


def _check(tmp_path, text: str, **fields) -> tuple[str, object]:
    fields.setdefault("words", "[E] engine build failed")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", text.format(log=str(log), **fields))
    return f"cmd:{PY} {script} {{model}}", log


def _calls(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("replays, expected", [(None, 9), (0, 7)])
def test_a_deterministic_check_costs_a_known_number_of_calls(tmp_path, replays, expected):
    """n5 of an 8-node chain, the check fails while n5 is in the model. By default: confirm (1),
    the pack calibration [probe, original] failing — the original's replay (2) —, group testing
    over the 8 singles (n0–n3 passes, n4–n7 fails, n4–n5 fails, n4 passes, n5 fails: 3–7; a call
    passed, so no Identity probe), the final judgement answered by the cache (n5 was judged
    alone: the call that chose it is no evidence for it), so the result runs twice afresh (8–9):
    4 calls outside the search (issue 39). --replays 0: no replays, the calibration is only a
    calibration (7). Before issue 25: 11 and 8 (the original's replay and the probe were calls
    of their own; the result was replayed twice); before issue 39: 10 (the result replayed three times)."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n5"])
    result = shrink(path, target, str(tmp_path / "out"), replays=replays, shrink_shapes=False)
    summary = result.summary
    assert summary["minimal"]["node_names"] == ["n5"]
    assert summary["calls"]["target"] == _calls(log) == expected, (summary["steps"], _calls(log))
    assert sum(s["calls"] for s in summary["steps"]) == expected, summary["steps"]
    assert "probe" not in {s["step"] for s in summary["steps"] if s["calls"]}, summary["steps"]
    if replays is None:
        assert summary["original_replays"] == "0 call(s) of its own at confirm and one riding with the calibration pack"


def test_the_probe_runs_only_when_no_call_passed(tmp_path):
    """n0 fails: every call of the search fails (the calibration, n0–n3, n0–n1, n0), so before the
    result is accepted the Identity probe runs (and passes): 1 + 1 + 3 + 1 probe = 6 calls."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n0"])
    summary = shrink(path, target, str(tmp_path / "out"), replays=0, shrink_shapes=False).summary
    assert summary["minimal"]["node_names"] == ["n0"]
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert steps.get("probe") == 1, steps
    assert summary["calls"]["target"] == _calls(log) == sum(steps.values()), (steps, _calls(log))


def test_a_check_that_always_fails_is_refused_with_exit_4(tmp_path):
    """No call ever passes, so the probe runs before any result is accepted, and fails alike."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence="F")
    proc = run_cli("shrink", path, "--target", target, "-o", str(tmp_path / "out"))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "does not depend on the model" in proc.stderr and "FLAKY FAILURE" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "minimal.onnx").exists()
    # confirm, the calibration (its replay), the survey down to n0 (3), the probe
    assert _calls(log) == 6, _calls(log)


def test_a_check_that_passed_the_original_twice_is_not_said_to_never_fail(tmp_path):
    """A check failing every other call that happens to pass the original twice (the first run
    and its replay) may still fail: the message says so and how to go on, never "does not diverge"."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence="PPF")
    proc = run_cli("shrink", path, "--target", target, "-o", str(tmp_path / "out"))
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert "the check passed on the original twice: it does not fail, or fails only sometimes" in proc.stderr
    assert "does not diverge" not in proc.stderr
    assert "fails only sometimes must fail every time first" in proc.stderr and "reprokit check" in proc.stderr
    assert _calls(log) == 2, _calls(log)


@pytest.mark.parametrize("sequence, code, where", [
    # confirm F, the calibration pack P: the original alone decides, P → flaky original
    ("FPP", 6, "unchanged model"),
    # confirm F, calibration F (its replay), the search answers at random, the result replay
    # passes where the search judged it failing: flaky result, never "done"
    ("FFPFFFPFP", 7, "reduced model"),
])
def test_a_flaky_check_ends_with_the_flaky_verdict(tmp_path, sequence, code, where):
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence=sequence)
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", target, "-o", str(out))
    assert proc.returncode == code, proc.stderr[-2000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("Error:"))
    assert "is flaky" in error and where in error and "agree ×" in error, error
    if (out / "summary.json").exists():
        assert json.loads((out / "summary.json").read_text())["status"] == "flaky"


@pytest.mark.parametrize("max_calls", [6, 8, 9, 11])
def test_a_tight_max_calls_is_never_exceeded(tmp_path, max_calls):
    """A pair that fails only together (n2 and n6), its message naming a shape so that a crop is
    tried: the search, the probe reserved until a call passes, the original's replay, the final
    judgement, its replays and the crop all come out of one budget, counted by the check itself.
    (6 is the least a check command's run is allowed: --max-calls 5 is refused, exit 2.) --no-pack:
    the report archive runs the check once more on minimal.onnx, after the shrink, outside the
    budget (docs/no-slippage.md says so)."""
    path = sm.save(chain(shape=(4, 16)), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n2", "n6"], words="[E] bad shape [4, 16]")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", target, "-o", str(out), "--max-calls", str(max_calls), "--no-pack")
    assert proc.returncode in (0, 7, 8), proc.stderr[-2000:]
    assert _calls(log) <= max_calls, (_calls(log), proc.stderr[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calls"]["target"] == _calls(log), (summary["calls"], _calls(log))



def test_a_calibration_pack_passing_earns_the_result_two_more_runs(tmp_path):
    """The original fails alone, passes inside the calibration pack, fails alone again (a check
    that reads part of a pack, or a coin: one run in 8 of a 50%-flaky check): the result must
    then fail 4 fresh runs, not 2, before "done" (issue 39). The check answers F P F — the
    calibration comes with the survey's first pack (issue 39: a run that never packs never
    calibrates) —, the survey's left half, its packs now off, one by one (n0: F), then F F F P on
    the result: its fourth run passes, so the run ends "flaky" (exit 7). Before issue 39 the
    result ran 3 times afresh and this run ended "done" (exit 0) on n0."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence="FPF" + "F" + "FFFP")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", target, "-o", str(out), "--no-pack")
    assert proc.returncode == 7, proc.stderr[-2000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("Error:"))
    assert "is flaky" in error and "reduced model" in error and "agree ×1" in error, error
    assert _calls(log) == 8, _calls(log)
    assert json.loads((out / "summary.json").read_text())["status"] == "flaky"


def test_no_reduce_inputs_searches_windows_at_polygraphy_s_calls(tmp_path):
    """polygraphy's --no-reduce-inputs: nodes go only from the end, so a node alone is no
    candidate (but the first). n5 of the 8-node chain: the conflict search's prefixes alone, no
    survey pack and, since a prefix passes before a best is kept, no Identity probe: confirm,
    prefixes n0–n3 (pass), n0–n5 (fail), n0–n4 (pass), ddmin's coarsest deletion n0–n2 (pass) —
    5 calls; no calibration pack, since nothing is packed. Before issue 39: 7 (a survey pack of
    its own, and the calibration)."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n5"])
    summary = shrink(path, target, str(tmp_path / "out"), replays=0, shrink_shapes=False, keep_inputs=True).summary
    assert summary["minimal"]["node_names"] == [f"n{k}" for k in range(6)]
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert summary["calls"]["target"] == _calls(log) == 5, (steps, _calls(log))
    assert "survey" not in steps and "probe" not in steps, steps
