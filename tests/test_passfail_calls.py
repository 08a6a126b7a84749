"""What a pass/fail check command pays outside the search (issues 25, 39): the original is judged
once, its replays are fresh runs of the result, the pack calibration comes only before a passing
pack is trusted, the Identity probe runs only when no call of the run passed, the result is
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
    group testing over the 8 singles (n0–n3 passes: before that pass clears them, the pack
    calibration [probe, original] — nothing smaller was seen failing yet —, n4–n7 fails, n4–n5
    fails, n4 passes, n5 fails: 2–7; a call passed, so no Identity probe), the final judgement
    answered by the cache (n5 was judged alone: the call that chose it is no evidence for it), so
    the result runs twice afresh (8–9): 4 calls outside the search, the original never replayed
    (issue 39). --replays 0: no replays (7). Before issue 25: 11 and 8 (the original's replay
    and the probe were calls of their own; the result was replayed twice); before issue 39: 10
    (the result replayed three times)."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n5"])
    result = shrink(path, target, str(tmp_path / "out"), replays=replays, shrink_shapes=False)
    summary = result.summary
    assert summary["minimal"]["node_names"] == ["n5"]
    assert summary["calls"]["target"] == _calls(log) == expected, (summary["steps"], _calls(log))
    assert sum(s["calls"] for s in summary["steps"]) == expected, summary["steps"]
    assert "probe" not in {s["step"] for s in summary["steps"] if s["calls"]}, summary["steps"]
    if replays is None:
        assert summary["original_replays"].startswith("none: a pass/fail check's failing original is not replayed")


def test_the_probe_runs_only_when_no_call_passed(tmp_path):
    """n0 fails: every call of the search fails (n0–n3, n0–n1, n0; no pack passed, so no
    calibration), so before the result is accepted the Identity probe runs (and passes):
    1 + 3 + 1 probe = 5 calls."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, NAME_CHECK, fail=["n0"])
    summary = shrink(path, target, str(tmp_path / "out"), replays=0, shrink_shapes=False).summary
    assert summary["minimal"]["node_names"] == ["n0"]
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert steps.get("probe") == 1 and "calibrate" not in steps, steps
    assert summary["calls"]["target"] == _calls(log) == sum(steps.values()) == 5, (steps, _calls(log))


def test_a_check_that_always_fails_is_refused_with_exit_4(tmp_path):
    """No call ever passes, so the probe runs before any result is accepted, and fails alike."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence="F")
    proc = run_cli("shrink", path, "--target", target, "-o", str(tmp_path / "out"))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "does not depend on the model" in proc.stderr and "FLAKY FAILURE" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "minimal.onnx").exists()
    # confirm, the survey down to n0 (3: no pack passed, no calibration), the probe
    assert _calls(log) == 5, _calls(log)


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
    # confirm P, its replay F: a flaky original
    ("PF", 6, "unchanged model"),
    # confirm F, the search answers at random, a fresh run of the result passes where the
    # search judged it failing: flaky result, never "done"
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
    """The original fails alone, the survey's first pack passes, and so does the calibration pack
    that comes before that pass is trusted — the original, after the probe — while the original
    alone fails again (a check that reads part of a pack, or a coin): packs go off, and the
    result must then fail 4 fresh runs, not 2, before "done". The check answers F (confirm),
    P (n0–n3), P (calibration), F (the original alone), F (n0 alone, packs off), then F F F P on
    the result: its fourth run passes, so the run ends "flaky" (exit 7) after 9 calls. Before
    issue 39's fixed calls the calibration came before the first pack, the original alone then
    passed, and this run ended on the unchanged model (exit 6)."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    target, log = _check(tmp_path, sm.SEQUENCE_CHECK, sequence="FPPF" + "FFFFP")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", target, "-o", str(out), "--no-pack")
    assert proc.returncode == 7, proc.stderr[-2000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("Error:"))
    assert "is flaky" in error and "reduced model" in error and "agree ×1" in error, error
    assert _calls(log) == 9, _calls(log)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "flaky" and summary["no_slippage"]["packs"].startswith("one candidate per call")
    assert summary["original_replays"].startswith("1 call of its own, after the calibration pack passed it")


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


# NAME_CHECK that logs the node names of each model it is given (the calibration holds the probe).
NAMES_LOGGED = """
import sys
import onnx
names = [n.name for n in onnx.load(sys.argv[1]).graph.node]
with open({log!r}, "a") as handle:
    handle.write(",".join(names) + "\\n")
if "n2" in names:
    print("[E] engine build failed")
    sys.exit(1)
"""


def test_the_calibration_holds_the_smallest_pack_seen_failing(tmp_path):
    """n2 of the 8-node chain: the survey's pack n0–n3 fails (it clears nothing, so no calibration
    yet), n0–n1 passes: before that pass clears them, the calibration pack holds the probe and
    the members of n0–n3 (5 nodes), not the original (9: before issue 39's fixed calls it was
    made before the first pack, with the whole model). Packs stay on, and n2 is the result."""
    path = sm.save(chain(), tmp_path / "m.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", NAMES_LOGGED.format(log=str(log)))
    summary = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), shrink_shapes=False).summary
    assert summary["minimal"]["node_names"] == ["n2"]
    calls = [line.split(",") for line in log.read_text().splitlines()]
    calibration = [names for names in calls if "reprokit_probe" in names]
    assert len(calibration) == 1 and sorted(calibration[0]) == ["n0", "n1", "n2", "n3", "reprokit_probe"], calls
    assert calls.index(calibration[0]) > calls.index(["n0", "n1", "n2", "n3"]), calls
    assert summary["no_slippage"]["packs"].startswith("packed: the check failed a pack"), summary["no_slippage"]
    assert len([names for names in calls if len(names) == 8]) == 1, calls  # the original built once
