"""Fresh names for graph rewrites (reprokit/names.py): every rewrite's new nodes, tensors and
initializers stay unique, whatever the user's model is already called."""

from __future__ import annotations

import json

import models
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from reprokit.audit.layernorm import fuse_layernorms
from reprokit.standalone.emulation import emulate_model
from reprokit.standalone.names import FreshNames

WIDTH = 32


def two_layernorms_with_short_names() -> onnx.ModelProto:
    """Two decomposed LayerNorm blocks whose node names share only the prefix "n" (n12…n20,
    n92…n100), as an exporter numbering nodes writes them: both fused nodes were once named
    "n/LayerNormalization", with the same initializers. Large activations overflow fp16 in the
    squared deviations."""
    # x[2,WIDTH] -> MatMul "n11" -> LN(n12..n20) -> MatMul "n91" -> LN(n92..n100) -> Relu -> y
    rng = np.random.default_rng(7)
    nodes, inits = [], [models.const("two", np.float32(2.0)), models.const("eps", np.float32(1e-5))]

    def block(first: int, src: str, tag: str) -> str:
        names = [f"n{first + i}" for i in range(9)]
        mu, d, d2, var, ve, std, nrm, g, out = (f"{tag}_{k}" for k in
                                                ("mu", "d", "d2", "var", "ve", "std", "n", "g", "out"))
        inits.extend([models.const(f"{tag}_gamma", rng.uniform(0.5, 1.5, WIDTH)),
                      models.const(f"{tag}_beta", rng.uniform(-0.2, 0.2, WIDTH))])
        nodes.extend([
            helper.make_node("ReduceMean", [src], [mu], name=names[0], axes=[-1], keepdims=1),
            helper.make_node("Sub", [src, mu], [d], name=names[1]),
            helper.make_node("Pow", [d, "two"], [d2], name=names[2]),
            helper.make_node("ReduceMean", [d2], [var], name=names[3], axes=[-1], keepdims=1),
            helper.make_node("Add", [var, "eps"], [ve], name=names[4]),
            helper.make_node("Sqrt", [ve], [std], name=names[5]),
            helper.make_node("Div", [d, std], [nrm], name=names[6]),
            helper.make_node("Mul", [nrm, f"{tag}_gamma"], [g], name=names[7]),
            helper.make_node("Add", [g, f"{tag}_beta"], [out], name=names[8]),
        ])
        return out

    inits.append(models.const("w1", rng.normal(0, 60.0, (WIDTH, WIDTH))))
    nodes.append(helper.make_node("MatMul", ["x", "w1"], ["h1"], name="n11"))
    first = block(12, "h1", "a")
    inits.append(models.const("w2", rng.normal(0, 60.0, (WIDTH, WIDTH))))
    nodes.append(helper.make_node("MatMul", [first, "w2"], ["h2"], name="n91"))
    second = block(92, "h2", "b")
    nodes.append(helper.make_node("Relu", [second], ["y"], name="n101"))
    graph = helper.make_graph(nodes, "g", [models.vi("x", [2, WIDTH])], [models.vi("y", [2, WIDTH])], inits)
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def _run(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_fresh_names_keep_a_free_name_and_number_a_taken_one():
    pool = FreshNames(["a", "a_2"])
    assert pool.fresh("b") == "b" and pool.fresh("b") == "b_2"
    assert pool.fresh("a") == "a_3" and pool.fresh("a", ".") == "a.2"


def test_two_layernorm_blocks_with_a_short_common_prefix_fuse_into_two_distinct_nodes():
    model = two_layernorms_with_short_names()
    fused, matches = fuse_layernorms(model)
    assert len(matches) == 2 and len({m.fused for m in matches}) == 2
    onnx.checker.check_model(fused, full_check=True)
    inits = [t.name for t in fused.graph.initializer]
    assert len(inits) == len(set(inits))
    feeds = {"x": np.random.default_rng(8).normal(0, 1, (2, WIDTH)).astype(np.float32)}
    (want,), (got,) = _run(model, feeds), _run(fused, feeds)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_audit_of_that_model_sweeps_the_fused_layernorms(tmp_path, cli):
    path = models.save(two_layernorms_with_short_names(), tmp_path / "two_ln.onnx")
    proc = cli("audit", path, "--target", "emulate:fp16", "-o", str(tmp_path / "audit"), "--json", "--no-explain")
    assert proc.returncode == 0, proc.stderr
    rows = {row["key"]: row for row in json.loads(proc.stdout)["sweep"]}
    assert rows["layernorm"]["verdict"] not in ("not applicable", "error"), rows["layernorm"]


def test_emulation_casts_never_take_a_name_the_model_already_uses():
    """A user tensor already called like emulation's first choice for a Cast's output."""
    # x -> Relu "r" -> h ; h -> Add(w) -> w__rk_wide ; w__rk_wide -> Neg -> y
    model = models.make(
        [helper.make_node("Relu", ["x"], ["h"], name="r"),
         helper.make_node("Add", ["h", "w"], ["w__rk_wide"], name="w__rk_cast"),
         helper.make_node("Neg", ["w__rk_wide"], ["y"], name="neg")],
        [models.vi("x", [4])], [models.vi("y", [4])], [models.const("w", np.full(4, 0.1))])
    emulated = emulate_model(model, "fp16")
    onnx.checker.check_model(emulated, full_check=True)
    nodes = [n.name for n in emulated.graph.node]
    assert len(nodes) == len(set(nodes))
    feeds = {"x": np.linspace(-1, 1, 4, dtype=np.float32)}
    (want,), (got,) = _run(model, feeds), _run(emulated, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3)
