"""The answer is right (issue 24): each finding of the review rebuilt from its own small model.

Every test here failed at 48a88f1 and passes after: a wrong answer with exit 0 is the worst
outcome for a tool whose output is filed upstream."""

from __future__ import annotations

import json
import shlex

import numpy as np
import onnx
import pytest
from conftest import PY, run_cli
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


# --- 5. shape crops move their same-sized partners -------------------------------------------

def batch_partner_model() -> onnx.ModelProto:
    """x[2,4,16,16] → Relu → Mul(w[2,4,16,16], ≥1e5, other per batch) → y: the Mul overflows fp16;
    w has x's batch axis, so a crop of x's batch that leaves w whole would broadcast x[0]·w[1]."""
    w = (1e5 * (1 + np.arange(2 * 4 * 16 * 16, dtype=np.float32) / 512)).reshape(2, 4, 16, 16)
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Mul", ["r", "w"], ["y"], name="scale")],
                  [_value("x", [2, 4, 16, 16])], [_value("y", [2, 4, 16, 16])],
                  [numpy_helper.from_array(w, "w")])


def test_a_shape_crop_moves_a_same_sized_weight_along(tmp_path):
    import onnxruntime as ort

    onnx.save(batch_partner_model(), str(tmp_path / "m.onnx"))
    x = np.random.default_rng(0).uniform(1.5, 2.0, (2, 4, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "-o", str(out), "--no-pack")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(out)
    assert summary["minimal"]["ops"] == ["Mul"]
    original = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (truth,) = original.run(None, {"x": x})
    minimal = ort.InferenceSession(str(out / "minimal.onnx"), providers=["CPUExecutionProvider"])
    with np.load(out / "inputs.npz") as data:
        (got,) = minimal.run(None, dict(data))
        (name,) = list(data)
    windows = (summary.get("shapes") or {}).get("windows", {})
    box = tuple(slice(start, start + size) for start, size in windows.get(name, [[0, d] for d in truth.shape]))
    # the minimal computes a window of what the original computed: never x[0]·w[1]
    assert got.shape == truth[box].shape, (got.shape, windows)
    np.testing.assert_allclose(got, truth[box], rtol=1e-6)
    if name in windows:
        assert windows.get("w") == windows[name], "the weight moved with the input: the summary says so"


# --- 4. --fail-regex as polygraphy applies it ------------------------------------------------

def _identity_file(folder) -> str:
    """x[4] → Identity → y: a model the checks below never look into."""
    path = str(folder / "m.onnx")
    onnx.save(_model([helper.make_node("Identity", ["x"], ["y"], name="id")], [_value("x", [4])],
                     [_value("y", [4])]), path)
    return path


def _script(folder, name: str, body: str) -> str:
    path = folder / name
    path.write_text(body)
    return f"cmd:{PY} {shlex.quote(str(path))} {{model}}"


@pytest.mark.parametrize(("regexes", "code"), [
    (["error:\\s+nan"], 1),  # "max error:" and "nan" on two lines: polygraphy searches the whole output
    (["(?i)NAN"], 1),  # an inline flag: each regex is compiled alone (joined, it was exit 70)
    (["(ma)x error:\\s+\\d", "(n)an\\n\\1an"], 1),  # the second's \\1 is its own group, not the first's
    (["on stderr too"], 1),  # stderr is searched after stdout
    (["inf"], 0),
])
def test_fail_regex_is_searched_over_the_whole_output_each_regex_alone(tmp_path, regexes, code):
    target = _script(tmp_path, "check.py", "import sys\nprint('max error:')\nprint('nan')\nprint('nan')\n"
                                           "print('warning: on stderr too', file=sys.stderr)\n")
    args = [a for r in regexes for a in ("--fail-regex", r)]
    proc = run_cli("check", _identity_file(tmp_path), "--target", target, *args)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]


# --- 1. a NaN bug never "reduces" to an unrelated Inf: the causal test -----------------------

def nan_beside_hidden_inf_model() -> onnx.ModelProto:
    """x1 → Mul(1e5) b_mul → Clip(±10) → y1   (fp16 overflow to inf, hidden by the Clip)
    x2 → Mul(1e5) e_mul → e → Sub(e, e) → y2  (fp16 overflow, then inf - inf = NaN: the bug)"""
    big = numpy_helper.from_array(np.full((64,), 1e5, np.float32), "w")
    low, high = (numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((-10.0, "lo"), (10.0, "hi")))
    return _model([helper.make_node("Mul", ["x1", "w"], ["b"], name="b_mul"),
                   helper.make_node("Clip", ["b", "lo", "hi"], ["y1"], name="clip"),
                   helper.make_node("Mul", ["x2", "w"], ["e"], name="e_mul"),
                   helper.make_node("Sub", ["e", "e"], ["y2"], name="sub")],
                  [_value("x1", [64]), _value("x2", [64])], [_value("y1", [64]), _value("y2", [64])],
                  [big, low, high])


@pytest.mark.parametrize("packing", [[], ["--no-pack"]], ids=["packed", "one-by-one"])
def test_a_nan_bug_reduces_to_its_cause_not_to_an_inf_that_never_reaches_an_output(tmp_path, packing):
    onnx.save(nan_beside_hidden_inf_model(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", x1=rng.uniform(1.5, 2, 64).astype(np.float32),
             x2=rng.uniform(1.5, 2, 64).astype(np.float32))
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "-o", str(out), "--no-shrink-shapes", *packing)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(out)
    assert summary["signature"] == {"kind": "nonfinite", "outputs": ["y2"], "detail": "nan"}
    # the minimal lies in y2's cone: keeping b_mul in fp32 would fix nothing for the user
    assert set(summary["minimal"]["node_names"]) <= {"e_mul", "sub"}, summary["minimal"]
    assert summary["no_slippage"]["test"] == "causal injection"


# --- 2. integer outputs compare exactly; complex on both parts -------------------------------

def argmax_model() -> onnx.ModelProto:
    """x[1,1000] → ArgMax(axis 1) → y int64: a class id, where a near tie flips in fp16 storage."""
    return _model([helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0, name="argmax")],
                  [_value("x", [1, 1000])], [_value("y", [1], TensorProto.INT64)])


def test_an_argmax_that_flips_diverges_whatever_its_relative_error(tmp_path):
    onnx.save(argmax_model(), str(tmp_path / "m.onnx"))
    x = np.zeros((1, 1000), np.float32)
    x[0, 700], x[0, 701] = 5.0, 5.001  # one fp16 step at 5 is 0.004: both store as 5.0
    np.savez(tmp_path / "x.npz", x=x)
    proc = run_cli("check", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs",
                   str(tmp_path / "x.npz"), "--json")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (output,) = json.loads(proc.stdout)["verdict"]["outputs"]
    assert output["exact"] and output["mismatched"] == 1 and output["exceeds"]
    table = run_cli("check", str(tmp_path / "m.onnx"), "--target", "emulate:fp16", "--inputs", str(tmp_path / "x.npz"))
    assert "exact: 1 differ" in table.stdout


def test_complex_outputs_compare_on_both_parts():
    from reprokit.standalone.compare import Criterion, compare_arrays

    same_real = compare_arrays("c", np.array([1 + 1j, 2 + 0j]), np.array([1 + 2j, 2 + 0j]), Criterion())
    assert same_real.exceeds and same_real.max_abs == 1.0
    assert not compare_arrays("c", np.array([1 + 1j]), np.array([1 + 1j]), Criterion()).exceeds


# --- 3. group testing only where the check judges a whole pack -------------------------------

def chain_model(length: int = 20, culprit: int = 7) -> onnx.ModelProto:
    """x[16] → n0 → n1 → … → n19 → y, each a Mul by 1 except n{culprit}, a Mul by 1e7."""
    nodes, weights, previous = [], [], "x"
    for k in range(length):
        weights.append(numpy_helper.from_array(np.array(1e7 if k == culprit else 1.0, np.float32), f"c{k}"))
        output = "y" if k == length - 1 else f"t{k}"
        nodes.append(helper.make_node("Mul", [previous, f"c{k}"], [output], name=f"n{k}"))
        previous = output
    return _model(nodes, [_value("x", [16])], [_value("y", [16])], weights)


FIRST_OUTPUT_CHECK = """import sys
import numpy as np
import onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
first = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]
sys.exit(1 if np.abs(first).max() > 1e6 else 0)
"""


def test_a_check_that_reads_only_the_first_output_is_not_group_tested(tmp_path):
    onnx.save(chain_model(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.linspace(0.5, 1.5, 16, dtype=np.float32))
    target = _script(tmp_path, "check.py", FIRST_OUTPUT_CHECK).replace("{model}", "{model} {inputs}")
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", target, "--inputs", str(tmp_path / "x.npz"),
                   "-o", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = _summary(out)
    # every node after n7 fails too when fed n7's huge value: the earliest failing one is the culprit
    assert summary["minimal"]["node_names"] == ["n7"], summary["minimal"]
    assert summary["no_slippage"]["packs"].startswith("one candidate per call"), summary["no_slippage"]


# --- 6. a check that fails on every model is refused ----------------------------------------

def test_a_check_that_fails_on_a_one_node_identity_is_refused_before_reduction(tmp_path):
    onnx.save(chain_model(6, 3), str(tmp_path / "m.onnx"))
    target = _script(tmp_path, "check.py", "import sys\nprint('engine says: BAD MODEL')\nsys.exit(1)\n")
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", target, "-o", str(tmp_path / "out"))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "does not depend on the model" in proc.stderr and "BAD MODEL" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "minimal.onnx").exists()


# --- 7. --max-calls is a promise; a run that removed nothing says so -------------------------

def pair_model() -> onnx.ModelProto:
    """x[16] → n0 … n11 → y, unary ops; n3 is Sin and n8 Cos: the check below fails only when a
    model holds both (a pair that fails only together), and its words name neither."""
    ops = ["Relu", "Neg", "Abs", "Sin", "Neg", "Abs", "Relu", "Neg", "Cos", "Abs", "Neg", "Relu"]
    nodes = [helper.make_node(op, ["x" if k == 0 else f"t{k - 1}"], ["y" if k == len(ops) - 1 else f"t{k}"],
                              name=f"n{k}") for k, op in enumerate(ops)]
    return _model(nodes, [_value("x", [16])], [_value("y", [16])])


PAIR_CHECK = """import sys
import onnx
ops = {node.op_type for node in onnx.load(sys.argv[1]).graph.node}
sys.exit(1 if {"Sin", "Cos"} <= ops else 0)
"""


def test_the_call_budget_is_kept_and_a_run_that_removed_nothing_says_so(tmp_path):
    onnx.save(pair_model(), str(tmp_path / "m.onnx"))
    target = _script(tmp_path, "check.py", PAIR_CHECK)
    out = tmp_path / "out"
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", target, "-o", str(out), timeout=600)
    summary = _summary(out)
    assert summary["calls"]["target"] <= summary["budget"]["max_calls"], (summary["calls"], summary["budget"])
    # every target call is in a step, with its seconds and the nodes it built
    assert sum(s["calls"] for s in summary["steps"]) == summary["calls"]["target"], summary["steps"]
    assert all(s["seconds"] > 0 and s["nodes_built"] > 0 for s in summary["steps"] if s["calls"]), summary["steps"]
    if summary["minimal"]["nodes"] == 12:
        assert proc.returncode == 8 and summary["status"] == "nothing-removed", (proc.returncode, summary["status"])
        assert "no node was removed" in proc.stderr
    else:
        assert proc.returncode == 0 and summary["status"] == "done", proc.stderr[-2000:]
        assert set(summary["minimal"]["ops"]) >= {"Sin", "Cos"}


def test_a_budget_that_ends_before_anything_is_removed_is_not_done(tmp_path):
    onnx.save(pair_model(), str(tmp_path / "m.onnx"))
    target = _script(tmp_path, "check.py", PAIR_CHECK)
    out = tmp_path / "out"
    few = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", target, "-o", str(tmp_path / "few"),
                  "--max-calls", "5")
    assert few.returncode == 2 and "below the 6 target calls" in few.stderr, few.stderr
    # 6 at most outside the search (confirm + replay, calibration, probe, the result twice — issue
    # 39): the calibration usually is the replay and the probe runs only where no call passed; 1 for it
    proc = run_cli("shrink", str(tmp_path / "m.onnx"), "--target", target, "-o", str(out), "--max-calls", "7",
                   "--no-shrink-shapes", timeout=600)
    summary = _summary(out)
    assert summary["calls"]["target"] <= 7, summary["calls"]
    assert proc.returncode == 8 and summary["status"] == "nothing-removed", (proc.returncode, summary["status"])


# --- 8. the emulator's own rewrite is never blamed on the engine -----------------------------

def test_a_lift_the_reference_refuses_is_cannot_emulate_not_a_build_error(tmp_path):
    """onnx's operator test test_scan_sum (Scan-8): bf16 emulation must lift it to opset 13, where
    Scan has no batch axis and the lifted copy refuses the original feeds."""
    from onnx.backend.test.case import node

    (case,) = [c for c in node.collect_testcases("Scan") if c.name == "test_scan_sum"]
    onnx.save(case.model, str(tmp_path / "scan.onnx"))
    inputs, _ = case.data_sets[0]
    np.savez(tmp_path / "x.npz", **{i.name: v for i, v in zip(case.model.graph.input, inputs)})
    proc = run_cli("check", str(tmp_path / "scan.onnx"), "--target", "emulate:bf16", "--inputs", str(tmp_path / "x.npz"))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cannot emulate this model" in proc.stderr and "lifted from opset 8" in proc.stderr, proc.stderr
    fp16 = run_cli("check", str(tmp_path / "scan.onnx"), "--target", "emulate:fp16", "--inputs", str(tmp_path / "x.npz"))
    assert fp16.returncode == 0, fp16.stdout[-2000:]  # fp16 Casts exist at opset 8: nothing is lifted


def test_a_lift_that_computes_other_values_is_cannot_emulate_not_a_verdict(tmp_path):
    """Hardmax-12 takes the argmax over the input flattened from ``axis`` on; onnx's converter
    lifts it to Hardmax-13 unchanged, which takes it along ``axis`` alone: other values. The
    check runs both copies one after the other (their outputs never held together) and must
    still see the difference."""
    # x[2,3,4] -> Hardmax(axis=1) -> y   (opset 12)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], axis=1)], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.save(model, str(tmp_path / "hardmax.onnx"))
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32))
    proc = run_cli("check", str(tmp_path / "hardmax.onnx"), "--target", "emulate:bf16", "--inputs",
                   str(tmp_path / "x.npz"))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "lifted from opset 12 to 13 computes other values" in proc.stderr, proc.stderr
