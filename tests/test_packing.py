"""Many candidates per engine call, with real engines: packed numeric verdicts, group testing of
pass/fail checks, the node an engine's message names, accumulated error said honestly, the final
judgement alone, no slippage, and the user's own integer inputs kept as inputs.

Engines are real: the fp16/bf16 storage emulator and onnxruntime in worker processes, OpenVINO on
the CPU, and ``cmd`` checks written into tmp_path. Models are generated here or are the samples.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import shrink_models as sm
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.api import RunOptions, make_oracle
from reprokit.engine.activations import ActivationStore
from reprokit.engine.bug import NUMERIC, CausalTest
from reprokit.engine.oracle import Kind, Signature
from reprokit.errors import NothingRemoved
from reprokit.graph.index import GraphIndex
from reprokit.graph.pack import build_pack, feed_key
from reprokit.shrink.budget import (
    PACK_MEMORY_FLOOR,
    SHARED_FEEDS_RUNS,
    Limits,
    default_replays,
    pack_memory,
    packs_share_feeds,
)
from reprokit.shrink.members import Member, Room, fit, member_cost
from reprokit.shrink.reducer import Journal, Reducer
from reprokit.shrink.steps import shrink as shrink_run

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
PY = shlex.quote(sys.executable)
sys.path.insert(0, str(REPO / "bench"))
import planted  # noqa: E402


def shrink(*args, **kwargs):
    """These tests count the node reduction's calls: shape shrinking (its own calls, its own
    tests in test_shapes.py) is off."""
    return shrink_run(*args, shrink_shapes=False, **kwargs)


CMD_REPLAYS = sum(default_replays("cmd:true"))  # the original once (the calibration), the result once (twice afresh)
# a check command's Identity probe and its pack calibration (issue 24): two calls of every cmd
# run, before any reduction (the probe only where the calibration is skipped: --no-pack)
CMD_PROBES = 2

def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _reducer(out_dir, model_path, inputs, target, tmp, packing):
    """A Reducer over the activations a finished shrink captured, judging with ``target``."""
    model = onnx.load(model_path)
    summary = json.loads(Path(out_dir, "summary.json").read_text())
    oracle = make_oracle(target, RunOptions(inputs=str(inputs)), str(tmp / f"calls-{packing}"))
    with np.load(inputs) as data:
        feeds = {k: data[k] for k in data.files}
    signature = Signature(Kind(summary["signature"]["kind"]), tuple(summary["signature"]["outputs"]),
                          summary["signature"]["detail"])
    reducer = Reducer(model, GraphIndex.build(model), ActivationStore.open(str(Path(out_dir, ".reprokit", "activations"))),
                      feeds, oracle, signature, workdir=str(tmp), journal=Journal(None),
                      best=frozenset(range(len(model.graph.node))))
    reducer.packing = packing
    if signature.kind in NUMERIC:  # the decision the run holds (reducer_setup.hold_to)
        reducer.causal = CausalTest(oracle, model, reducer.index, reducer.store, feeds, signature, oracle.criterion,
                                    str(tmp))
    return reducer


@pytest.fixture(scope="module")
def layernorm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ln") / "out"
    name = "layernorm_overflow"
    result = shrink(str(SAMPLES / f"{name}.onnx"), "emulate:fp16", str(out),
                    options=RunOptions(inputs=str(SAMPLES / f"{name}.inputs.npz")))
    return out, SAMPLES / f"{name}.onnx", SAMPLES / f"{name}.inputs.npz", result


@pytest.mark.parametrize("target,shared", [("emulate:fp16", False), ("emulate:fp16", True), ("openvino:f32", False)])
def test_a_packed_verdict_equals_the_verdicts_of_the_candidates_run_one_by_one(layernorm_run, tmp_path, target,
                                                                               shared):
    if target.startswith("openvino"):
        pytest.importorskip("openvino", reason="OpenVINO not installed")
    out, model, inputs, _ = layernorm_run
    n = len(onnx.load(model).graph.node)
    # every node alone, a few regions (overlapping ones too) and the pair chain of the first nodes
    candidates = [frozenset([i]) for i in range(0, n, 3)] + [frozenset(range(i, i + 5)) for i in range(0, n - 5, 11)]
    packed = _reducer(out, model, inputs, target, tmp_path, "numeric")
    packed.share_feeds = shared  # regions and singles cut at one tensor read one input
    alone = _reducer(out, model, inputs, target, tmp_path, None)
    together = packed.verdicts(candidates)
    one_by_one = alone.verdicts(candidates)
    assert packed.oracle.stats.target == 1  # one engine call answered every candidate
    assert alone.oracle.stats.target == sum(1 for o in one_by_one if o.kind not in ("no-outputs", "invalid"))
    assert [o.kind for o in together] == [o.kind for o in one_by_one]
    assert [o.interesting for o in together] == [o.interesting for o in one_by_one]
    # The emulator rounds each tensor on its own: the same numbers. OpenVINO compiles the pack as
    # one graph; its f32 kernels may sum in another order, far below any tolerance.
    rtol, atol = (1e-6, 0.0) if target == "emulate:fp16" else (1e-2, 1e-6)
    for a, b in zip(together, one_by_one):
        assert (a.error is None) == (b.error is None)
        if a.error is not None:
            assert np.isclose(float(a.error), float(b.error), rtol=rtol, atol=atol, equal_nan=True)
    if target == "emulate:fp16":  # the overflowing Pow alone is among the candidates
        assert any(o.kind == "nonfinite" for o in together)


def test_a_hit_judged_already_ahead_of_unjudged_candidates_answers_without_a_call(layernorm_run, tmp_path):
    """``first_interesting`` asks for the earliest candidate that shows the signature: when every
    candidate before a known hit is known (riders of an earlier call), that is the answer and the
    unjudged ones after it cost no pack (PP-OCRv4 rec under openvino:bf16: the pairs step spent a
    call on 238 pairs after the hit, the 28th likeliest, had ridden in localize's call)."""
    out, model, inputs, result = layernorm_run
    loaded = onnx.load(model)
    names = [node.name for node in loaded.graph.node]
    minimal = frozenset(names.index(name) for name in result.summary["minimal"]["node_names"])
    # one node shows it alone: the Pow, whose Inf (injected: the causal test) causes the mismatch
    singles = [frozenset([i]) for i in range(len(names))]
    reducer = _reducer(out, model, inputs, "emulate:fp16", tmp_path, "numeric")
    judged = singles[:3] + [minimal]
    unjudged = [s for s in singles[3:] if s != minimal]
    assert [o.interesting for o in reducer.verdicts(judged)] == [False, False, False, True]
    assert reducer.oracle.stats.target == 1 and all(reducer.cached(c) is None for c in unjudged)
    hit = 3
    # the known ones up to the hit, then candidates never judged: answered from what is known
    assert reducer.first_interesting(judged + unjudged) == hit
    assert reducer.oracle.stats.target == 1 and all(reducer.cached(c) is None for c in unjudged)
    # an unjudged candidate before the hit must be asked: one packed call, the same answer after it
    assert reducer.first_interesting([unjudged[-1], *judged]) == hit + 1
    assert reducer.oracle.stats.target == 2


def test_pairs_ride_likeliest_first_after_the_survey(layernorm_run, tmp_path):
    """The pairs offered to a later call's spare room go in the order of their two nodes' errors
    alone (the survey's), largest first: where the room runs out, the least likely are left."""
    from reprokit.shrink.passes import survey

    out, model, inputs, _ = layernorm_run
    reducer = _reducer(out, model, inputs, "emulate:fp16", tmp_path, "numeric")
    order = reducer.ordered()
    reducer.isolated.update(zip(order, reducer.verdicts([frozenset([i]) for i in order])))
    survey.ride_pairs(reducer)
    riders = [pair for pair, _ in reducer.take_riders()]
    error = {i: float(o.error) if o.error is not None and o.error == o.error else (0.0 if o.error is None else math.inf)
             for i, o in reducer.isolated.items()}
    scores = [sum(error[i] for i in pair) for pair in riders]
    assert sorted(riders, key=sorted) == sorted(survey.matchings(reducer, order), key=sorted)  # every pair, once
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
    assert max(error, key=error.get) in riders[0]


def test_samples_shrink_in_at_most_four_calls_to_a_1_minimal_model(layernorm_run):
    summary = layernorm_run[3].summary
    assert summary["calls"]["target"] <= 4
    assert summary["one_minimal"] is True
    assert summary["build_work"]["nodes_built"] > 0
    assert summary["build_work"]["candidates_judged"] > summary["calls"]["target"]


def test_summary_says_what_extraction_packing_writing_and_comparing_cost(layernorm_run):
    books = layernorm_run[3].summary["bookkeeping"]
    kinds = ("extraction", "pack", "write", "compare")
    # a packed survey ran: candidates were cut out, packed, written and judged
    assert all(books[k] > 0 for k in kinds), books
    assert books["seconds"] == pytest.approx(sum(books[k] for k in kinds), abs=0.01)
    assert books["seconds"] < layernorm_run[3].summary["wall_s"]


def test_a_small_pack_limit_splits_the_calls_but_not_the_result(layernorm_run, tmp_path):
    out, model, inputs, baseline = layernorm_run
    result = shrink(str(model), "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=str(inputs)),
                    limits=Limits(capture_chunk_bytes=1 << 20, max_calls=None))
    assert result.summary["minimal"]["node_names"] == baseline.summary["minimal"]["node_names"]
    assert result.summary["calls"]["target"] > baseline.summary["calls"]["target"]


@pytest.mark.parametrize("bound,heavy", [(256 << 10, False), (64 << 10, True)])
def test_a_memory_bound_splits_the_survey_and_finds_the_same_node(tmp_path, bound, heavy):
    # planted.blocks: 114 nodes, 100 KiB of weights, ~1 MiB of survey data (every node alone and
    # the marked whole model). Under 256 KiB the survey is split into several packed calls; under
    # 64 KiB the weights pass half a pack, so the marked model runs alone and the nodes nearest
    # its anchor are judged first (the heavy path).
    path, inputs = planted.save(*planted.blocks(), str(tmp_path), "m")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=inputs),
                    limits=Limits(pack_memory_bytes=bound, max_calls=None))
    whole = shrink(path, "emulate:fp16", str(tmp_path / "whole"), options=RunOptions(inputs=inputs),
                   limits=Limits(max_calls=None))
    survey, one = (next(s for s in r.summary["steps"] if s["step"] == "survey") for r in (result, whole))
    assert survey["calls"] > 1 and one["calls"] == 1
    # both stop at the first pack that holds a node showing it alone: the split survey's packs
    # follow the graph's order (block1/qk is in the middle block), the heavy path's the distance
    # from the anchor; the one-call survey judges every node
    assert survey["candidates"] < result.summary["original"]["nodes"] <= one["candidates"]
    assert result.summary["minimal"]["node_names"] == whole.summary["minimal"]["node_names"] == ["block1/qk"]
    assert result.summary["one_minimal"] is True


def test_pack_memory_on_the_command_line_bounds_the_packs(tmp_path):
    path, inputs = planted.save(*planted.blocks(), str(tmp_path), "m")
    bad = run_cli("shrink", path, "--target", "emulate:fp16", "--inputs", inputs, "-o", str(tmp_path / "bad"),
                  "--pack-memory", "lots")
    assert bad.returncode == 2 and "Error: cannot parse --pack-memory 'lots'" in bad.stderr, bad.stderr
    assert "Hint:" in bad.stderr and "Traceback" not in bad.stderr
    proc = run_cli("shrink", path, "--target", "emulate:fp16", "--inputs", inputs, "-o", str(tmp_path / "out"),
                   "--pack-memory", "256K", "--max-calls", "0", "--no-shrink-shapes", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert next(s for s in summary["steps"] if s["step"] == "survey")["calls"] > 1  # one call under auto (above)
    assert summary["minimal"]["node_names"] == ["block1/qk"]


def test_the_auto_memory_bound_is_a_multiple_of_a_marked_run_between_the_floor_and_a_capture_chunk():
    mib = 1 << 20
    assert pack_memory(Limits(), 200 * mib) == 400 * mib  # PP-OCRv4 rec: ~200 MiB marked run
    assert pack_memory(Limits(), 200 * mib, shared_feeds=True) == int(SHARED_FEEDS_RUNS * 200 * mib)
    assert pack_memory(Limits(), 10 * mib) == PACK_MEMORY_FLOOR  # a sample: one call, as before
    assert pack_memory(Limits(capture_chunk_bytes=300 * mib), 200 * mib) == 300 * mib
    assert pack_memory(Limits(pack_memory_bytes=5 * mib), 200 * mib, shared_feeds=True) == 5 * mib  # --pack-memory
    assert packs_share_feeds("emulate:bf16") and packs_share_feeds("ort")
    assert not any(packs_share_feeds(t) for t in ("openvino:bf16", "ort:opt", "ort:cuda,fp16", "trt:fp16"))


def _regions(reducer, n):
    """Every node alone and overlapping 3-node windows: most cut at a tensor another one is cut at."""
    subs = [reducer.extraction(frozenset(c), check=False)
            for c in [[i] for i in range(n)] + [range(i, i + 3) for i in range(0, n - 3, 2)]]
    return [sub for sub in subs if sub.outputs]


def test_members_cut_at_one_tensor_read_one_input_and_compute_the_same(layernorm_run, tmp_path):
    import onnxruntime as ort

    out, model, inputs, _ = layernorm_run
    reducer = _reducer(out, model, inputs, "emulate:fp16", tmp_path, "numeric")
    subs = _regions(reducer, len(onnx.load(model).graph.node))
    disjoint = build_pack(subs, keep_node_names=False)
    shared = build_pack(subs, keep_node_names=False, share_feeds=True)
    keys = {feed_key(value) for sub in subs for value in sub.feeds.values()}
    assert len(shared.feeds) == len(keys) < len(disjoint.feeds)
    assert {n for n in shared.feeds} <= set(disjoint.feeds)  # the first member's copy is the one kept
    values = []
    for pack in (disjoint, shared):
        session = ort.InferenceSession(pack.model.SerializeToString(), providers=["CPUExecutionProvider"])
        values.append(dict(zip([o.name for o in session.get_outputs()], session.run(None, pack.feeds))))
    assert values[0].keys() == values[1].keys()
    assert all(np.array_equal(values[0][k], values[1][k], equal_nan=True) for k in values[0])


def test_a_shared_feed_counts_once_against_the_memory_bound(layernorm_run, tmp_path):
    out, model, inputs, _ = layernorm_run
    reducer = _reducer(out, model, inputs, "emulate:fp16", tmp_path, "numeric")
    members = [Member(None, sub) for sub in _regions(reducer, len(onnx.load(model).graph.node))]

    def held(shared: bool) -> int:
        reducer.share_feeds = shared
        room = Room()
        for member in members:
            room.add(member_cost(reducer, member), 0)
        return room.bytes

    copies, once = held(False), held(True)
    assert once < copies
    reducer.pack_bytes = once  # holds the members with one copy of each feed, not with a copy each
    assert len(fit(reducer, members)) == 1
    reducer.share_feeds = False
    assert len(fit(reducer, members)) == 2


def test_jobs_do_not_change_a_packed_result(layernorm_run, tmp_path):
    out, model, inputs, baseline = layernorm_run
    result = shrink(str(model), "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=str(inputs)),
                    jobs=2)
    assert Path(result.minimal_path).read_bytes() == Path(out, "minimal.onnx").read_bytes()


@pytest.mark.parametrize("make,expect", [(planted.blocks, {"block1/qk"}), (planted.l2norm, None),
                                         (planted.chain, {"fault/up"})])
def test_planted_numeric_faults_take_at_most_four_calls(tmp_path, make, expect):
    path, inputs = planted.save(*make(), str(tmp_path), "m")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=inputs))
    summary = result.summary
    assert summary["calls"]["target"] <= 4, summary["steps"]
    assert summary["one_minimal"] is True
    if expect is not None:
        assert summary["verdict"]["signature"]["kind"] == summary["signature"]["kind"]
        assert set(summary["minimal"]["node_names"]) == expect
    else:  # the L2 normalization: the square overflows to Inf, which (injected) causes the mismatch
        assert summary["minimal"]["ops"] == ["Mul"] and summary["signature"]["kind"] == "mismatch"
        assert summary["verdict"]["signature"]["kind"] == "nonfinite"
        assert summary["no_slippage"]["accepted"].get("shows it: causal test"), summary["no_slippage"]


def _name_checker(tmp_path, fail_node: str) -> str:
    """A pass/fail check that fails (exit 1, no names printed) when the node is present."""
    return sm.write_script(tmp_path, "check.py", f"""
    import sys
    import onnx
    names = {{n.name for n in onnx.load(sys.argv[1]).graph.node}}
    if {fail_node!r} in names:
        print("[E] engine build failed")
        sys.exit(1)
    """)


def test_group_testing_finds_the_one_failing_node_among_63_in_about_log2_calls(tmp_path):
    # 63 nodes: from conflict.HALVE_FROM (64) on there is no survey, the conflict search's halving
    # finds a single node (tests/test_passfail_build_cost.py)
    model = sm.pair_chain(length=63, first=4, second=50)
    path = sm.save(model, tmp_path / "chain.onnx")
    name = model.graph.node[37].name
    script = _name_checker(tmp_path, name)
    result = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"))
    summary = result.summary
    assert summary["minimal"]["node_names"] == [name]
    assert summary["one_minimal"] is True
    # confirm + binary splitting over 63 singles (⌈log2 63⌉ = 6) + the leaf alone; one by one
    # this would be up to 63 calls. The whole model's failure is inferred from the confirming run,
    # so when its left half passes the right half is tested, not inferred (+1: "no single fails
    # alone" then costs 2 calls, not log2 64). A cmd check is not trusted to be deterministic: the
    # original is replayed once and the result twice afresh (CMD_REPLAYS), whatever the search; it must
    # pass a one-node probe and judge a pack as a whole (CMD_PROBES).
    assert summary["calls"]["target"] <= 1 + 1 + 6 + 1 + CMD_REPLAYS + CMD_PROBES
    survey = next(s for s in summary["steps"] if s["step"] == "survey")
    assert survey["candidates"] > survey["calls"]


def test_a_build_error_naming_a_node_in_a_120_node_model_takes_at_most_3_calls(tmp_path):
    pytest.importorskip("openvino", reason="OpenVINO not installed")
    path, inputs = planted.save(*planted.with_named_op("Det"), str(tmp_path), "det")
    result = shrink(path, "openvino:f32", str(tmp_path / "out"), options=RunOptions(inputs=inputs))
    summary = result.summary
    assert summary["signature"]["kind"] == "build-error"
    assert summary["minimal"]["node_names"] == ["suspect"]
    assert summary["calls"]["target"] <= 3
    assert next(s for s in summary["steps"] if s["step"] == "named")["accepted"] == 1


def test_a_parser_message_naming_a_node_in_a_120_node_model_takes_at_most_3_calls(tmp_path):
    path, inputs = planted.save(*planted.with_named_op("Unique"), str(tmp_path), "unique")
    script = planted.write_checker(str(tmp_path), "parser.py", planted.PARSER_CHECKER)
    result = shrink(path, f"cmd:{PY} {script} {{model}}", str(tmp_path / "out"), options=RunOptions(inputs=inputs))
    assert result.summary["minimal"]["node_names"] == ["suspect"]
    assert result.summary["calls"]["target"] <= 3 + CMD_REPLAYS + CMD_PROBES


def _accumulating_mlp(layers: int = 24) -> onnx.ModelProto:
    """x[8,64] → layers × (MatMul → Tanh): each layer's bf16 error is small, together they add up."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Tanh", [f"m{k}"], [f"t{k}"], name=f"tanh{k}")]
        h = f"t{k}"
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                  [helper.make_tensor_value_info(h, TensorProto.FLOAT, [8, 64])], inits)


def test_an_accumulated_error_judged_one_by_one_keeps_each_nodes_own_error(tmp_path):
    """--one-by-one judges every node alone in a call of its own: the attribution and the
    workaround's ranking read those errors as they read a packed survey's (they said "0 of 0
    nodes" and "no node has an error of its own" before)."""
    path = sm.save(_accumulating_mlp(8), tmp_path / "mlp8.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:bf16", "--tol", "0.004", "-o", str(out), "--one-by-one",
                   "--max-calls", "0", "--no-pack")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    found = summary["attribution"]
    assert summary["status"] == "accumulated" and found["nodes_judged_alone"] == 16 and found["top"]
    assert found["workaround"]["agrees"] and 0 < found["workaround"]["size"] < 16


def test_accumulated_error_is_said_with_an_attribution_not_a_big_minimal_model(tmp_path):
    path = sm.save(_accumulating_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:bf16", "--tol", "0.01", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "accumulated error" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "accumulated"
    assert not (out / "minimal.onnx").exists()  # no model is called minimal
    found = summary["attribution"]
    assert found["nodes_judged_alone"] == 48 and found["diverging_alone"] == 0
    # no node diverges alone, so no region was grown: the note does not claim none shows it
    assert found["regions_judged"] is False and "no region was grown" in summary["note"]
    assert found["top"] and found["top"][0]["op"] == "MatMul" and found["fp32_nodes"]
    assert len(found["cumulative"]) >= 24
    tested = found["workaround"]  # the attribution's tested fp32 set: found packed, run as printed
    assert tested["agrees"] and tested["method"] == "packed" and tested["error"] <= 0.01
    window = next(s for s in summary["steps"] if s["step"] == "drift window")
    # 4 to find the error accumulated, the workaround's, the window's packed rounds and its run
    # alone (in the window's step since it goes through the evaluator)
    assert summary["calls"]["target"] <= 4 + tested["calls"] + window["calls"]
    # the archive carries the drift window, and ISSUE.md says what was found
    import tarfile

    with tarfile.open(out / "report.tar.gz") as archive:
        issue = next(m for m in archive.getmembers() if m.name.endswith("/ISSUE.md"))
        text = archive.extractfile(issue).read().decode()
    assert "accumulating" in text and f"`{found['top'][0]['node']}`" in text
    assert f"`{tested['setting']}` → agree" in text and "run exactly as printed" in text


def test_a_resumed_accumulated_run_asks_no_precision_trial_again(tmp_path):
    """Issue 25: the precision search's trials are journaled, so --resume after a budget stop in
    the middle of the search asks only the untried sets, after one in the drift window none at
    all, and reaches the same workaround; its calls count against --max-calls (they did not)."""
    path = sm.save(_accumulating_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "out"

    def shrink_with(*args, into=out):
        proc = run_cli("shrink", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads((into / "summary.json").read_text())
        assert summary["status"] == "accumulated"
        return summary, summary["attribution"]["workaround"]

    whole, tested = shrink_with(path, "--target", "emulate:bf16", "--tol", "0.01", "-o", str(tmp_path / "whole"),
                                "--max-calls", "0", into=tmp_path / "whole")
    assert tested["agrees"] and tested["calls"] >= 2 and tested["cached"] == 0
    # cut inside the search: confirm, survey and one call left of the budget
    first, cut = shrink_with(path, "--target", "emulate:bf16", "--tol", "0.01", "-o", str(out), "--max-calls", "4")
    assert first["budget"]["stopped"] and first["calls"]["target"] <= 4
    assert not cut["agrees"] and 0 < cut["calls"] < tested["calls"] and "--resume" in cut["note"]
    # resumed with room for the rest of the search but not the drift window
    second, resumed = shrink_with("--resume", str(out), "--max-calls", str(4 + 1 + tested["calls"] - cut["calls"]))
    assert resumed["calls"] == tested["calls"] - cut["calls"] and resumed["cached"] == len(cut["trials"])
    assert second["budget"]["stopped"] and second["window"] is None and "--resume" in second["note"]
    assert resumed["setting"] == tested["setting"] and resumed["agrees"]
    # resumed again with no limit: no precision call at all, the same workaround, then the window
    third, again = shrink_with("--resume", str(out), "--max-calls", "0")
    assert again["calls"] == 0 and again["cached"] == len(tested["trials"])
    assert next(s for s in third["steps"] if s["step"] == "attribution")["calls"] == 0
    assert {k: again[k] for k in ("setting", "verdict", "error", "size")} == \
        {k: tested[k] for k in ("setting", "verdict", "error", "size")}
    assert not third["budget"]["stopped"] and third["window"]["nodes"] == whole["window"]["nodes"]
    journal = [json.loads(line) for line in (out / ".reprokit" / "journal.jsonl").read_text().splitlines()]
    assert len([e for e in journal if e["key"].startswith("precision:")]) == len(tested["trials"])


def test_an_accumulated_run_interrupted_in_the_precision_search_resumes_without_asking_again(tmp_path):
    """Ctrl-C once the precision search has journaled its first call's trials: exit 130, and
    --resume reads those trials back (no call for them), makes only the rest of the search's calls
    and reaches the workaround an uninterrupted run reaches."""
    import subprocess

    from conftest import interrupt_when, reprokit_exe

    path = sm.save(_accumulating_mlp(64), tmp_path / "mlp64.onnx")
    args = ["shrink", path, "--target", "emulate:bf16", "--tol", "0.01", "--max-calls", "0", "--no-pack"]
    whole = run_cli(*args, "-o", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    tested = json.loads((tmp_path / "whole" / "summary.json").read_text())["attribution"]["workaround"]
    assert tested["agrees"] and tested["calls"] >= 2
    out = tmp_path / "out"
    journal = out / ".reprokit" / "journal.jsonl"

    def trials() -> int:
        return journal.read_text().count('"precision:') if journal.exists() else 0

    proc = subprocess.Popen([reprokit_exe(), *args, "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    err = interrupt_when(proc, lambda: trials() > 0)
    assert proc.returncode == 130, err
    judged = trials()
    resumed = run_cli("shrink", "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    again = json.loads((out / "summary.json").read_text())["attribution"]["workaround"]
    assert again["cached"] == judged and again["calls"] < tested["calls"], (judged, again, tested)
    assert {k: again[k] for k in ("setting", "verdict", "error")} == {k: tested[k] for k in ("setting", "verdict", "error")}


def test_a_result_that_does_not_reproduce_alone_is_not_done(tmp_path):
    """A check that fails the model's first 4 runs (the Identity probe, the 3rd run, passes: it
    holds no Sigmoid) and passes ever after: confirmed, then the search's answers stop making
    sense and the final judgement alone does not fail — exit 7, status not-reproduced, never
    "done"."""
    model = sm.pair_chain(length=16, first=4, second=12)
    path = sm.save(model, tmp_path / "chain.onnx")
    counter = tmp_path / "runs.txt"
    script = sm.write_script(tmp_path, "fading.py", f"""
    import pathlib, sys
    counter = pathlib.Path({str(counter)!r})
    runs = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(runs + 1))
    if runs < 4 and b"Sigmoid" in open(sys.argv[1], "rb").read():
        print("[E] engine build failed")
        sys.exit(1)
    """)
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", f"cmd:{sys.executable} {script} {{model}}", "-o", str(out),
                   "--no-pack")
    assert proc.returncode == 7, proc.stderr
    assert "does not show" in proc.stderr and "Hint:" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "not-reproduced"


def test_the_user_integer_inputs_stay_inputs_of_the_minimal_model(tmp_path):
    """input_ids[1,6] (int64) → Gather(embedding with values past fp16's range) → MatMul → out."""
    table = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)
    table[7] *= 1e5  # token 7's embedding overflows fp16 storage
    model = _model(
        [helper.make_node("Gather", ["embedding", "input_ids"], ["e"], name="gather"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")],
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])],
        [numpy_helper.from_array(table, "embedding"),
         numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
    path = sm.save(model, tmp_path / "ids.onnx")
    inputs = tmp_path / "ids.npz"
    np.savez(inputs, input_ids=np.array([[1, 7, 3, 7, 2, 0]], np.int64))
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=str(inputs)))
    minimal = onnx.load(result.minimal_path)
    # the embedding is clamped to 65504 in fp16 (as TensorRT does): the MatMul's sum overflows
    assert "gather" in [n.name for n in minimal.graph.node]
    assert "input_ids" in [i.name for i in minimal.graph.input]
    assert "input_ids" not in [t.name for t in minimal.graph.initializer]
    with np.load(os.path.join(result.out_dir, "inputs.npz")) as data:
        assert data["input_ids"].tolist() == [[1, 7, 3, 7, 2, 0]]


def test_the_fault_that_was_localized_stays_in_every_later_candidate(tmp_path):
    """Two faults on one output: an overflow (x·x past 65504, then normalized) and a product of
    two big finite values that loses precision. Once the overflow's region is localized, a
    candidate without its anchor is never judged: ddmin cannot slip to the other fault."""
    b = planted._with_int64(planted._Builder(7))
    big = b.op("Mul", ["x", b.const("gain_c", 400.0)], "gain")
    normed = planted._l2norm(b, big, "l2")
    other = b.op("Sub", [b.op("Mul", ["x", b.const("k", 3000.0)], "wide"), b.const("off", 3000.0)], "cancel")
    out = b.op("Add", [normed, b.op("Mul", [other, b.const("tiny", 1e-4)], "scale")], "out")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                   [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4, 64])], b.inits)
    path, inputs = planted.save(model, {"x": np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)},
                                str(tmp_path), "two")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=inputs),
                    limits=Limits(max_calls=None))
    names = set(result.summary["minimal"]["node_names"])
    # the overflow itself (its Inf, injected, causes the mismatch): never the precision fault
    assert names == {"l2/square"}, names
    assert result.summary["no_slippage"]["accepted"].get("shows it: causal test"), result.summary["no_slippage"]


def _mild_and_severe():
    """x → Add(64) → Sub(64): fp16 storage costs ~2.8 % here (a mild mismatch, just over the 1 %
    tolerance); x → ×400 → L2-normalize: the square overflows, the output is lost (severe).
    out = mild + 20 · normalized."""
    b = planted._with_int64(planted._Builder(9))
    shifted = b.op("Add", ["x", b.const("shift_c", 64.0)], "shift")
    mild = b.op("Sub", [shifted, b.const("unshift_c", 64.0)], "unshift")
    normed = planted._l2norm(b, b.op("Mul", ["x", b.const("gain_c", 400.0)], "gain"), "l2")
    scaled = b.op("Mul", [normed, b.const("twenty_c", 20.0)], "twenty")
    out = b.op("Add", [mild, scaled], "out")
    model = _model(b.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                   [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4, 64])], b.inits)
    return model, {"x": np.random.default_rng(5).random((4, 64)).astype(np.float32)}


def test_a_much_milder_mismatch_is_not_the_same_bug(tmp_path):
    path, inputs = planted.save(*_mild_and_severe(), str(tmp_path), "mild")
    result = shrink(path, "emulate:fp16", str(tmp_path / "out"), options=RunOptions(inputs=inputs))
    summary = result.summary
    names = set(summary["minimal"]["node_names"])
    assert "unshift" not in names and "l2/square" in names, names
    assert any(k.startswith("milder mismatch") for k in summary["other_findings"]), summary["other_findings"]
    assert max(float(o["error"]) for o in summary["verdict"]["outputs"]) >= 0.1
    milder = shrink(path, "emulate:fp16", str(tmp_path / "milder"), options=RunOptions(inputs=inputs),
                    accept_milder=True)
    assert milder.summary["minimal"]["node_names"] == ["unshift"]


def test_a_resumed_run_counts_every_call_of_the_run_and_keeps_its_budget(tmp_path):
    """Calls have one source: a run stopped at its budget and resumed with a larger one reports
    the calls of both processes, and the resumed part stays within the new budget."""
    model = sm.pair_chain(length=32, first=4, second=27)
    path = sm.save(model, tmp_path / "chain.onnx")
    log = tmp_path / "runs.log"
    script = sm.write_script(tmp_path, "pair.py", f"""
    import sys
    with open({str(log)!r}, "a") as handle:
        handle.write("run\\n")
    data = open(sys.argv[1], "rb").read()
    if b"Sigmoid" in data and b"Tanh" in data:
        print("[E] Error Code 2: unsupported pair")
        sys.exit(1)
    """)
    out = tmp_path / "out"
    try:
        shrink(path, f"cmd:{PY} {script} {{model}}", str(out), localize_first=False, limits=Limits(max_calls=10))
    except NothingRemoved:
        pass  # stopped before anything was removed: said (exit 8), the summary written all the same
    first = json.loads((out / "summary.json").read_text())
    assert first["budget"]["stopped"] and first["calls"]["target"] <= 10
    # each process probes and calibrates the check again (2 calls each, CMD_PROBES)
    second = shrink(path, f"cmd:{PY} {script} {{model}}", str(out), localize_first=False, resume=True,
                    limits=Limits(max_calls=40 + 2 * CMD_PROBES))
    runs = len(log.read_text().splitlines())
    assert second.summary["calls"]["target"] == runs <= 40 + 2 * CMD_PROBES
    assert second.summary["calls"]["this_process"] < runs
    assert sorted(second.summary["minimal"]["ops"]) == ["Sigmoid", "Tanh"]
