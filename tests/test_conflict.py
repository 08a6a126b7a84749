"""Nodes that fail only together (issue 25): the conflict-set search on real small models and real
``cmd:`` check scripts — a pair at other places in a branchy graph, three nodes that fail only
together, a MatMul→Add fusion in a transformer-like block, a Conv→Relu fusion that needs its edge
intact — and the budget it claims, kept across ``--resume``.

The cases are this file's own (the benchmark's pair and fusion rows are not used here). Each
asserts the exact nodes and an upper bound on the calls derived from the search's cost: the
survey's singles cost 2 calls when no node fails alone (the whole is known to fail, both halves
are judged), and the conflict search at most 2⌈log2 n⌉ + 3 for a pair (a bisection for each
node, one fusion guess, one "does the pair fail alone" question) and QuickXplain's
2k·⌈log2(n/k)⌉ + 2k for k ≤ √n necessary nodes among n.
"""

from __future__ import annotations

import json
import math
import shlex
import sys

import numpy as np
import onnx
import shrink_models as sm
from onnx import helper

from reprokit.shrink.budget import Limits
from reprokit.shrink.passes.conflict import allowance, bound
from reprokit.shrink.steps import shrink

PY = shlex.quote(sys.executable)
F = sm.FLOAT

NAMES_CHECK = """
    # Fails (exit 1) like a build error when every node named on the command line is in the model.
    import sys
    import onnx
    names = {n.name for n in onnx.load(sys.argv[1]).graph.node}
    if all(name in names for name in sys.argv[2:]):
        print("[E] engine build failed")
        sys.exit(1)
"""

FUSION_CHECK = """
    # A builder whose PRODUCER+READER fusion is broken: fails (saying nothing of where) when the
    # node named argv[2] has exactly one reader, the node named argv[3], and its output is no graph
    # output (marking the tensor prevents the fusion).
    import sys
    import onnx
    graph = onnx.load(sys.argv[1]).graph
    outputs = {o.name for o in graph.output}
    by_name = {n.name: n for n in graph.node}
    producer = by_name.get(sys.argv[2])
    if producer is not None and producer.output[0] not in outputs:
        readers = [n.name for n in graph.node if producer.output[0] in n.input]
        if readers == [sys.argv[3]]:
            print("[E] engine build failed")
            sys.exit(1)
"""


def branchy(blocks: int = 12) -> onnx.ModelProto:
    """x[1,8] → ``blocks`` × (a → {b1 → b2, c} → Add): a diamond per block, 5 nodes each, plus a
    last Identity: node "blk{k}/{a,b1,b2,c,sum}"."""
    nodes, h = [], "x"
    for k in range(blocks):
        p = f"blk{k}/"
        nodes += [sm.node("Abs", [h], [p + "a"], p + "a"),
                  sm.node("Neg", [p + "a"], [p + "b1"], p + "b1"),
                  sm.node("Relu", [p + "b1"], [p + "b2"], p + "b2"),
                  sm.node("Softsign", [p + "a"], [p + "c"], p + "c"),
                  sm.node("Add", [p + "b2", p + "c"], [p + "sum"], p + "sum")]
        h = p + "sum"
    nodes.append(sm.node("Identity", [h], ["y"], "last"))
    return sm.make(nodes, [helper.make_tensor_value_info("x", F, [1, 8])],
                   [helper.make_tensor_value_info("y", F, [1, 8])])


def transformer_like(layers: int = 4) -> onnx.ModelProto:
    """x[4,16] → ``layers`` × (LayerNorm-ish: ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div →
    MatMul "L{k}/fc1" → Add "L{k}/bias1" → Relu → MatMul "L{k}/fc2" → Add "L{k}/bias2" → residual Add)."""
    rng = np.random.default_rng(3)
    nodes, inits, h = [], [sm.const("eps", [1e-5])], "x"
    for k in range(layers):
        p = f"L{k}/"
        inits += [sm.const(p + "w1", rng.standard_normal((16, 32)) * 0.2), sm.const(p + "b1", rng.standard_normal(32)),
                  sm.const(p + "w2", rng.standard_normal((32, 16)) * 0.2), sm.const(p + "b2", rng.standard_normal(16))]
        nodes += [sm.node("ReduceMean", [h], [p + "mu"], p + "mean", axes=[-1]),
                  sm.node("Sub", [h, p + "mu"], [p + "d"], p + "center"),
                  sm.node("Mul", [p + "d", p + "d"], [p + "sq"], p + "square"),
                  sm.node("ReduceMean", [p + "sq"], [p + "var"], p + "var", axes=[-1]),
                  sm.node("Add", [p + "var", "eps"], [p + "ve"], p + "eps"),
                  sm.node("Sqrt", [p + "ve"], [p + "sd"], p + "sd"),
                  sm.node("Div", [p + "d", p + "sd"], [p + "n"], p + "norm"),
                  sm.node("MatMul", [p + "n", p + "w1"], [p + "m1"], p + "fc1"),
                  sm.node("Add", [p + "m1", p + "b1"], [p + "a1"], p + "bias1"),
                  sm.node("Relu", [p + "a1"], [p + "r"], p + "act"),
                  sm.node("MatMul", [p + "r", p + "w2"], [p + "m2"], p + "fc2"),
                  sm.node("Add", [p + "m2", p + "b2"], [p + "a2"], p + "bias2"),
                  sm.node("Add", [h, p + "a2"], [p + "out"], p + "residual")]
        h = p + "out"
    nodes.append(sm.node("Identity", [h], ["y"], "last"))
    return sm.make(nodes, [helper.make_tensor_value_info("x", F, [4, 16])],
                   [helper.make_tensor_value_info("y", F, [4, 16])], inits)


def conv_stack(blocks: int = 10) -> onnx.ModelProto:
    """x[1,3,8,8] → ``blocks`` × (Conv 3x3 "c{k}/conv" → Relu "c{k}/relu"), every third block with a
    residual Add reading the Conv output too (two readers: no fusion there)."""
    rng = np.random.default_rng(5)
    nodes, inits, h = [], [], "x"
    for k in range(blocks):
        p = f"c{k}/"
        inits.append(sm.const(p + "w", rng.standard_normal((3, 3, 3, 3)) * 0.3))
        nodes.append(sm.node("Conv", [h, p + "w"], [p + "conv"], p + "conv", pads=[1, 1, 1, 1]))
        nodes.append(sm.node("Relu", [p + "conv"], [p + "relu"], p + "relu"))
        h = p + "relu"
        if k % 3 == 2:
            nodes.append(sm.node("Add", [p + "relu", p + "conv"], [p + "res"], p + "res"))
            h = p + "res"
    nodes.append(sm.node("Identity", [h], ["y"], "last"))
    return sm.make(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info("y", F, [1, 3, 8, 8])], inits)


THOROUGH = Limits(max_calls=None)  # no call budget: the bounds below are the search's own


def run(tmp_path, model, script_text: str, *args: str) -> dict:
    path = sm.save(model, tmp_path / "model.onnx")
    script = sm.write_script(tmp_path, "check.py", script_text)
    target = f"cmd:{PY} {script} {{model}} " + " ".join(shlex.quote(a) for a in args)
    return shrink(path, target, str(tmp_path / "out"), limits=THOROUGH, replays=0).summary


def calls(summary: dict, step: str) -> int:
    return sum(s["calls"] for s in summary["steps"] if s["step"] == step)


def search_bound(n: int, k: int) -> int:
    """The conflict search's calls for k necessary nodes among n (module docstring)."""
    return 2 * math.ceil(math.log2(n)) + 3 if k == 2 else bound(n, k)


def assert_found(summary: dict, expected: list[str], n: int, *, one_half: bool = False) -> None:
    assert sorted(summary["minimal"]["node_names"]) == sorted(expected)
    assert summary["one_minimal"] is True
    assert summary["verdict"]["signature"] == summary["signature"]
    # no single fails: the two halves, each judged once; when the nodes all lie in one half, its
    # singles' pack fails and binary splitting goes down it, at most 2 calls a level
    survey = 2 * math.ceil(math.log2(n)) if one_half else 2
    assert calls(summary, "survey") <= survey, summary["steps"]
    assert calls(summary, "conflict") <= search_bound(n, len(expected)), summary["steps"]


def test_a_pair_inside_two_branches_of_a_branchy_graph(tmp_path):
    model = branchy()  # 61 nodes; the pair: a side branch early, the other branch of a late diamond
    summary = run(tmp_path, model, NAMES_CHECK, "blk2/c", "blk9/b1")
    assert_found(summary, ["blk2/c", "blk9/b1"], 61)


def test_a_pair_at_the_two_ends_of_a_branchy_graph(tmp_path):
    summary = run(tmp_path, branchy(), NAMES_CHECK, "blk0/a", "last")
    assert_found(summary, ["blk0/a", "last"], 61)


def test_a_pair_in_one_half_of_a_branchy_graph(tmp_path):
    """Both nodes in the first half: the singles' pack of that half fails and binary splitting
    goes down it (at most 2 calls a level) before no single explains it; the conflict search then
    starts from the smallest union seen failing alone."""
    summary = run(tmp_path, branchy(), NAMES_CHECK, "blk1/b2", "blk4/c")
    assert_found(summary, ["blk1/b2", "blk4/c"], 61, one_half=True)


def test_three_nodes_that_fail_only_together(tmp_path):
    model = sm.pair_chain(length=40, first=3, second=35)  # nodes n00..n39
    summary = run(tmp_path, model, NAMES_CHECK, "n07", "n21", "n33")
    assert_found(summary, ["n07", "n21", "n33"], 40)


def test_a_layernorm_like_chain_that_needs_all_its_nodes(tmp_path):
    """Seven nodes in a row, all needed: found as a chain (each left out in turn once the two ends
    are known), within QuickXplain's bound."""
    names = [f"L1/{n}" for n in ("mean", "center", "square", "var", "eps", "sd", "norm")]
    summary = run(tmp_path, transformer_like(), NAMES_CHECK, *names)
    assert_found(summary, names, 53, one_half=True)  # layer 1 of 4: the first half


def test_a_matmul_add_fusion_in_a_transformer_like_model(tmp_path):
    model = transformer_like()  # 53 nodes
    summary = run(tmp_path, model, FUSION_CHECK, "L2/fc2", "L2/bias2")
    assert_found(summary, ["L2/fc2", "L2/bias2"], 53)
    # a fusion: the pair is the node found last and its producer, found by the one guess
    assert calls(summary, "conflict") <= math.ceil(math.log2(53)) + 1


def test_a_fusion_that_needs_its_edge_intact_keeps_it_internal(tmp_path):
    model = conv_stack()  # 24 nodes
    summary = run(tmp_path, model, FUSION_CHECK, "c4/conv", "c4/relu")
    assert_found(summary, ["c4/conv", "c4/relu"], 24)
    minimal = onnx.load(tmp_path / "out" / "minimal.onnx")
    # the Conv output stays internal (read by the Relu only), as the fusion needs
    assert "c4/conv" not in {o.name for o in minimal.graph.output}


def test_a_resumed_run_keeps_the_allowance_the_search_was_granted(tmp_path):
    """Under the auto budget the conflict search claims its bound for a pair on top of the
    bisection budget. Four nodes that fail only together need more: the run stops at the budget.
    Resumed with the same (auto) budget it is granted the same allowance once, not again: its
    passes stop at once, where they were."""
    model = sm.pair_chain(length=63, first=3, second=60)  # under conflict.HALVE_FROM: prefixes only
    path = sm.save(model, tmp_path / "chain.onnx")
    script = sm.write_script(tmp_path, "check.py", NAMES_CHECK)
    log = tmp_path / "runs.log"
    counting = sm.write_script(tmp_path, "counting.py", f"""
    import subprocess, sys
    with open({str(log)!r}, "a") as handle:
        handle.write("run\\n")
    sys.exit(subprocess.call([sys.executable, {str(script)!r}, *sys.argv[1:]]))
    """)
    target = f"cmd:{PY} {counting} {{model}} n05 n17 n30 n41 n58"
    out = str(tmp_path / "out")
    first = shrink(path, target, out, replays=0).summary
    assert first["budget"]["stopped"]
    granted = first["budget"]["max_calls"]
    assert first["calls"]["target"] == len(log.read_text().splitlines()) <= granted
    # the windows the search saw failing alone were kept as it closed in: a smaller model, not the original
    assert first["minimal"]["nodes"] < 64
    journal = [json.loads(line) for line in open(tmp_path / "out" / ".reprokit" / "journal.jsonl")]
    # one grant, journaled: the bound for a pair, less the bisection the auto budget already holds
    assert [e["calls"] for e in journal if e["key"].startswith("allowance:")] == [allowance(63)]
    assert allowance(63) == bound(63) - 2 * math.ceil(math.log2(64))
    assert allowance(64) == bound(64) - 2 * math.ceil(math.log2(65)) + 4 * 6 + 1  # halved first

    # resumed with the same auto budget: the same allowance, already spent — the passes make no
    # call (the resumed run's own confirming call and final judgement aside), and it says so
    again = shrink(path, target, out, replays=0, resume=True).summary
    assert again["budget"]["max_calls"] == granted
    assert again["budget"]["stopped"] and again["budget"]["spent"] == 0
    assert again["calls"]["target"] == len(log.read_text().splitlines())
    assert again["minimal"]["node_names"] == first["minimal"]["node_names"]
