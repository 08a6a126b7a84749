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
