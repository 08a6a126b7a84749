"""What a pass/fail search builds (issue 39): a check's cost on TensorRT is the size of the model
each call builds, not only the number of calls. The conflict search halves windows of the graph
on models of ``conflict.HALVE_FROM`` nodes and more (a fusion, a single, a distant pair), where
the prefix bisection built about b·log2 n nodes; a run that never packs makes no calibration
pack (a named node: 4 calls outside the search, the original's replay alone).

Every count here comes from the check itself: a real ``cmd:`` check script appends one line per
call with the node count of the model it was given, so nodes reprokit forgot to count still show.
"""

from __future__ import annotations

import math
import sys

import onnx
import shrink_models as sm

from reprokit.shrink.passes.conflict import HALVE_FROM
from reprokit.shrink.steps import shrink

PY = sys.executable

# Fails (exit 1) like a build error while every node named on the command line is in the model;
# logs the node count of each model it is given.
NAMES_CHECK = """
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
with open({log!r}, "a") as handle:
    handle.write(f"{{len(graph.node)}}\\n")
names = {{n.name for n in graph.node}}
if all(name in names for name in sys.argv[2:]):
    print("[E] engine build failed")
    sys.exit(1)
"""

# A builder whose PRODUCER→READER fusion is broken: fails while the node named argv[2] has exactly
# one reader, the node named argv[3], and its output is no graph output; logs the node count.
FUSION_CHECK = """
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
with open({log!r}, "a") as handle:
    handle.write(f"{{len(graph.node)}}\\n")
outputs = {{o.name for o in graph.output}}
producer = {{n.name: n for n in graph.node}}.get(sys.argv[2])
if producer is not None and producer.output[0] not in outputs:
    if [n.name for n in graph.node if producer.output[0] in n.input] == [sys.argv[3]]:
        print("[E] engine build failed")
        sys.exit(1)
"""

# The engine's parser names the node it cannot import (TensorRT's words), and fails.
PARSER_CHECK = """
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
with open({log!r}, "a") as handle:
    handle.write(f"{{len(graph.node)}}\\n")
for index, node in enumerate(graph.node):
    if node.name == sys.argv[2]:
        print(f"[E] In node {{index}} with name: {{node.name}} and operator: {{node.op_type}} (parseNode): "
              "UNSUPPORTED_NODE")
        sys.exit(1)
"""


def _run(tmp_path, model: onnx.ModelProto, text: str, *args: str) -> tuple[dict, list[int]]:
    path = sm.save(model, tmp_path / "model.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", text.format(log=str(log)))
    target = f"cmd:{PY} {script} {{model}} " + " ".join(args)
    summary = shrink(path, target, str(tmp_path / "out")).summary
    return summary, [int(line) for line in log.read_text().split()]


def _search(summary: dict) -> int:
    fixed = ("confirm", "calibrate", "replay", "final")
    return sum(s["calls"] for s in summary["steps"] if s["step"] not in fixed)


def test_a_distant_pair_in_a_long_chain_builds_about_twice_the_model(tmp_path):
    # x → n000 → … → n179 → y (unary ops); the check fails while n030 and n150 are both kept
    model = sm.pair_chain(length=180, first=30, second=150)
    for node in model.graph.node:
        node.name = f"n{int(node.name[1:]):03d}"
    assert len(model.graph.node) >= HALVE_FROM
    summary, built = _run(tmp_path, model, NAMES_CHECK, "n030", "n150")
    assert sorted(summary["minimal"]["node_names"]) == ["n030", "n150"]
    assert summary["one_minimal"] is True
    assert sum(built) == summary["build_work"]["nodes_built"]
    by_kind = summary["build_work"]["by_kind"]
    # the halves (180), then both sides narrowed a half at a time, the larger first (90 + 45,
    # 45 + 45, 45 + 23 …: about 2.5·180 in all); the prefix bisection built about 150·8 + 120·7
    # ≈ 2,000 nodes here
    assert by_kind["conflict: alone"] <= 4 * 180, by_kind
    assert "survey: alone" not in by_kind  # no survey pack of every node: the halving finds a single too
    # ⌈log2 C(180, 2)⌉ = 14 bits, the halves' second question and the pair judged alone
    assert _search(summary) <= math.ceil(math.log2(180 * 179 / 2)) + 3, summary["steps"]


def test_a_fusion_deep_in_a_conv_stack_builds_windows_around_it(tmp_path):
    # x → 60 × (Conv "c{k}/conv" → Relu "c{k}/relu", every third block a residual Add) → y: 141 nodes
    from test_conflict import conv_stack

    model = conv_stack(blocks=60)
    n = len(model.graph.node)
    assert n >= HALVE_FROM
    summary, built = _run(tmp_path, model, FUSION_CHECK, "c45/conv", "c45/relu")
    assert sorted(summary["minimal"]["node_names"]) == ["c45/conv", "c45/relu"]
    minimal = onnx.load(tmp_path / "out" / "minimal.onnx")
    assert "c45/conv" not in {o.name for o in minimal.graph.output}  # the fusion's edge kept internal
    assert sum(built) == summary["build_work"]["nodes_built"]
    # windows halving down to the pair: at most 2·n (both halves at every level), where prefixes
    # up to the pair (~3/4 of the model) built about 0.75·n·log2 n ≈ 930 nodes
    assert summary["build_work"]["by_kind"]["conflict: alone"] <= 2 * n, summary["build_work"]
    # the original once (confirm) and the result three times: no calibration pack of the whole
    # model, since nothing was packed
    assert [s["step"] for s in summary["steps"] if s["step"] == "calibrate" and s["calls"]] == []
    assert summary["build_work"]["nodes_built"] <= 2 * n + 2 * n + 4


def test_a_named_node_builds_the_original_once_and_no_calibration(tmp_path):
    """The parser names the node: one call finds it, nothing is ever packed, so no calibration
    pack is built; the original is built once (confirm: issue 39 replays the result, not the
    original). No call passed before n21 is kept, so the Identity probe runs (and passes: a
    check failing whatever the model fails it, so it stands for a third run of the result),
    and the one-node result runs twice afresh — 3 calls outside the search and the probe.
    Before issue 39's fixed calls the original ran twice (its replay alone): 80 of the nodes."""
    model = sm.pair_chain(length=40, first=3, second=35)
    summary, built = _run(tmp_path, model, PARSER_CHECK, "n21")
    assert summary["minimal"]["node_names"] == ["n21"]
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert "calibrate" not in steps and "replay" not in steps, steps
    assert steps["confirm"] == 1 and steps["probe"] == 1 and steps["final"] == 2, steps
    assert len(built) == summary["calls"]["target"]
    assert built.count(40) == 1, built  # the original built once, never packed
    assert built[-2:] == [1, 1], built  # the result, two fresh runs


def test_a_check_that_answers_in_turn_never_ends_done(tmp_path):
    """Windows are judged alone; a check that fails only sometimes (F, then P, on any model) is
    not replayed on the original (issue 39): its coin flips steer the search, and the result's
    fresh runs disagree — the flaky verdict on the reduced model (exit 7), never "done"."""
    from conftest import run_cli

    path = sm.save(sm.pair_chain(length=100, first=3, second=90), tmp_path / "m.onnx")
    log = tmp_path / "calls.log"
    script = sm.write_script(tmp_path, "check.py", sm.SEQUENCE_CHECK.format(log=str(log), sequence="FP"))
    proc = run_cli("shrink", path, "--target", f"cmd:{PY} {script} {{model}}", "-o", str(tmp_path / "out"),
                   "--no-pack")
    assert proc.returncode == 7, proc.stderr[-2000:]
    error = next(line for line in proc.stderr.splitlines() if line.startswith("Error:"))
    assert "is flaky" in error and "reduced model" in error, error
