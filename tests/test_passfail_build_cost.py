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


def exported_conv_stack(blocks: int = 20) -> onnx.ModelProto:
    """A MobileNet-like stack as torch exports it: x[1,3,8,8] → ``blocks`` × (Constant pads →
    Reshape(Constant shape) → Cast → Pad, Conv 3x3 "c{k}/conv" → Clip "c{k}/clip" with Constant
    min and max): 9 nodes a block, 3 of them computing from the input (the pads' shape arithmetic
    and the Constants are constant subgraphs)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    nodes, inits, h = [], [], "x"

    def constant(name, value):
        return sm.node("Constant", [], [name], name, value=numpy_helper.from_array(np.asarray(value), name))

    for k in range(blocks):
        p = f"c{k}/"
        inits.append(sm.const(p + "w", rng.standard_normal((3, 3, 3, 3)) * 0.3))
        nodes += [constant(p + "pads_raw", np.array([[0, 0, 1, 1], [0, 0, 1, 1]], dtype=np.int32)),
                  constant(p + "pads_shape", np.array([8], dtype=np.int64)),
                  sm.node("Reshape", [p + "pads_raw", p + "pads_shape"], [p + "pads_flat"], p + "pads_reshape"),
                  sm.node("Cast", [p + "pads_flat"], [p + "pads"], p + "pads_cast", to=TensorProto.INT64),
                  sm.node("Pad", [h, p + "pads"], [p + "pad"], p + "pad"),
                  sm.node("Conv", [p + "pad", p + "w"], [p + "conv"], p + "conv"),
                  constant(p + "lo", np.array(0.0, dtype=np.float32)),
                  constant(p + "hi", np.array(6.0, dtype=np.float32)),
                  sm.node("Clip", [p + "conv", p + "lo", p + "hi"], [p + "clip"], p + "clip")]
        h = p + "clip"
    return sm.make(nodes, [helper.make_tensor_value_info("x", sm.FLOAT, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info(h, sm.FLOAT, [1, 3, 8, 8])], inits)


def test_a_fusion_deep_in_an_exported_stack_builds_fewer_nodes_than_the_model(tmp_path):
    """Most nodes of a torch export are constant subgraphs (MobileNetV2: 942 of 1,094): the search
    asks windows of the nodes that compute from the input first, fed the constants' values, so a
    fusion deep in the stack costs fewer nodes than one build of the model (the windows of every
    node built about 1.7·n here, 2·n and more on MobileNetV2)."""
    model = exported_conv_stack(blocks=24)
    n = len(model.graph.node)
    assert n >= 150
    summary, built = _run(tmp_path, model, FUSION_CHECK, "c17/conv", "c17/clip")
    assert sorted(summary["minimal"]["node_names"]) == ["c17/clip", "c17/conv"]
    assert summary["one_minimal"] is True
    assert sum(built) == summary["build_work"]["nodes_built"]
    assert summary["build_work"]["by_kind"]["conflict: alone"] <= n, summary["build_work"]
    assert _search(summary) <= 2 * math.ceil(math.log2(n)), summary["steps"]


def test_a_distant_pair_in_an_exported_stack_is_found_exactly(tmp_path):
    """Two distant computing nodes that fail only together: the pair exactly, for fewer nodes than
    the windows of every node."""
    model = exported_conv_stack(blocks=24)
    n = len(model.graph.node)
    summary, built = _run(tmp_path, model, NAMES_CHECK, "c2/pad", "c21/clip")
    assert sorted(summary["minimal"]["node_names"]) == ["c2/pad", "c21/clip"]
    assert summary["one_minimal"] is True
    assert summary["build_work"]["by_kind"]["conflict: alone"] <= 2 * n, summary["build_work"]
    assert _search(summary) <= math.ceil(math.log2(72 * 71 / 2)) + 3, summary["steps"]


def test_a_needed_node_of_a_constant_subgraph_is_still_found(tmp_path):
    """A check that needs a node of a constant subgraph (the pads' Reshape) with a computing node:
    the search over the computing nodes ends on a set that does not fail, and the search over
    every node finds the pair."""
    model = exported_conv_stack(blocks=24)
    summary, _ = _run(tmp_path, model, NAMES_CHECK, "c6/pads_reshape", "c12/conv")
    assert sorted(summary["minimal"]["node_names"]) == ["c12/conv", "c6/pads_reshape"]
    assert summary["one_minimal"] is True


# Fails while any node of the operator type argv[2] is in the model, naming the type only (TensorRT's
# parser words); logs the node count.
OP_CHECK = """
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
with open({log!r}, "a") as handle:
    handle.write(f"{{len(graph.node)}}\\n")
if any(node.op_type == sys.argv[2] for node in graph.node):
    print(f"[E] [TRT] No importer registered for op: {{sys.argv[2]}}")
    sys.exit(1)
"""


def test_an_operator_named_by_type_costs_one_call_and_no_calibration(tmp_path):
    """A message naming an operator type holds for each node of it: the earliest alone is asked
    first, one call of one node — no pack, so no calibration of the whole model before it (BERT's
    Erf row: 3 calls and a 244-node calibration before)."""
    from onnx import helper

    # x[2,8] → 48 × (Abs, Neg, Erf "e{k}" every twelfth, else Relu) → y
    nodes, h = [], "x"
    for k in range(48):
        op = "Erf" if k % 12 == 5 else ["Abs", "Neg", "Relu"][k % 3]
        nodes.append(sm.node(op, [h], [f"t{k}"], f"n{k:02d}"))
        h = f"t{k}"
    model = sm.make(nodes, [helper.make_tensor_value_info("x", sm.FLOAT, [2, 8])],
                    [helper.make_tensor_value_info(h, sm.FLOAT, [2, 8])])
    summary, built = _run(tmp_path, model, OP_CHECK, "Erf")
    assert summary["minimal"]["node_names"] == ["n05"]
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert "calibrate" not in steps, steps
    assert steps["named"] == 1, steps
    assert built.count(1) >= 1 and sum(built) == summary["build_work"]["nodes_built"]


def test_a_message_naming_a_fusion_s_two_nodes_asks_them_alone_not_packed(tmp_path):
    """The check names the two nodes of the fusion it failed on: each is asked alone, then both
    together — 3 calls of 1, 1 and 2 nodes, where group testing them built a calibration of the
    whole 69-node model first."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "bench"))
    import planted

    path = os.path.join(root, "samples", "conv_clip.onnx")
    script = planted.write_checker(str(tmp_path), "fusion.py", planted.FUSION_CHECKER)
    summary = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out")).summary
    assert sorted(summary["minimal"]["node_names"]) == ["stem/conv", "stem/relu6"]
    assert summary["one_minimal"] is True
    steps = {s["step"]: s["calls"] for s in summary["steps"] if s["calls"]}
    assert "calibrate" not in steps and steps["named"] == 3, steps
    assert summary["build_work"]["by_kind"]["named: alone"] == 1 + 1 + 2, summary["build_work"]
