"""The committed sample models in samples/: reproducible, well-formed, and failing as catalogued."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
CATALOG = json.loads((SAMPLES / "catalog.json").read_text(encoding="utf-8"))
ENTRIES = CATALOG["samples"]
IDS = [e["name"] for e in ENTRIES]


@functools.cache
def _load_generator():
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_samples"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _session(model_or_path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    source = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _run(model_or_path, feeds):
    session = _session(model_or_path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _feeds(entry):
    with np.load(SAMPLES / entry["inputs"]) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def reference():
    """onnxruntime fp32 outputs of every sample on its committed feeds."""
    return {e["name"]: _run(str(SAMPLES / e["file"]), _feeds(e)) for e in ENTRIES}


def test_generator_is_byte_identical(tmp_path):
    written = _load_generator().generate(tmp_path)
    names = sorted(p.name for p in written)
    expected = sorted([e["file"] for e in ENTRIES] + [e["inputs"] for e in ENTRIES] + ["catalog.json"])
    assert names == expected
    for name in names:
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name


def test_catalog_lists_five_samples_with_known_verdicts():
    assert len(ENTRIES) == 5
    multi_in = [e for e in ENTRIES if len(e["input_shapes"]) > 1]
    multi_out = [e for e in ENTRIES if len(e["outputs"]) > 1]
    assert multi_in and multi_out
    for entry in ENTRIES:
        assert set(entry["expected"]) == {"emulate:fp16", "emulate:bf16", "openvino:bf16"}
        assert set(entry["expected"].values()) <= {"nonfinite", "mismatch", "agree"}
        assert entry["expected"]["emulate:fp16"] != "agree"
        assert entry["measured"]["emulate:fp16+keep_fp32"]["verdict"] == "agree"
        assert (SAMPLES / entry["file"]).stat().st_size < 1_500_000


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_model_is_well_formed(entry):
    model = onnx.load(str(SAMPLES / entry["file"]))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    nodes = model.graph.node
    assert 50 <= len(nodes) <= 300
    assert len(nodes) == entry["nodes"]
    names = [n.name for n in nodes]
    assert len(set(names)) == len(names) and all(names)
    # the fault sits inside the graph, not at either end
    position = names.index(entry["fault_node"])
    assert 0 < position < len(names) - 1
    assert nodes[position].op_type == entry["fault_op"]
    assert set(entry["keep_fp32"]) <= set(names)
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    shapes = {}
    for vi in inputs:
        assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") and d.dim_value > 0 for d in dims)
        shapes[vi.name] = [d.dim_value for d in dims]
    assert shapes == entry["input_shapes"]
    assert [o.name for o in model.graph.output] == entry["outputs"]
    feeds = _feeds(entry)
    assert {k: list(v.shape) for k, v in feeds.items()} == shapes
    assert all(v.dtype == np.float32 and v.min() >= 0 and v.max() < 1 for v in feeds.values())


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_reference_is_finite(entry, reference):
    outputs = reference[entry["name"]]
    assert list(outputs) == entry["outputs"]
    for name, value in outputs.items():
        assert np.isfinite(value).all(), name


def _emulated(entry, keep=frozenset()):
    from reprokit.engine.backends.emulate import emulate_model, round_through

    model = emulate_model(onnx.load(str(SAMPLES / entry["file"])), "fp16", frozenset(keep))
    feeds = {k: round_through(v, "fp16") for k, v in _feeds(entry).items()}
    return _run(model, feeds)


def _verdict(ref, target, threshold=1e-2):
    verdict = "agree"
    for name, r in ref.items():
        t = target[name]
        if not np.isfinite(t).all():
            return "nonfinite"
        rel = np.linalg.norm(t - r) / np.linalg.norm(r)
        if rel > threshold:
            verdict = "mismatch"
    return verdict


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_fp16_emulation_fails_as_catalogued(entry, reference):
    ref = reference[entry["name"]]
    assert _verdict(ref, _emulated(entry)) == entry["expected"]["emulate:fp16"]


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_keeping_the_fault_in_fp32_cures_it(entry, reference):
    ref = reference[entry["name"]]
    assert _verdict(ref, _emulated(entry, entry["keep_fp32"])) == "agree"


@pytest.mark.skipif(os.environ.get("REPROKIT_SAMPLES_SEEDS") is None,
                    reason="set REPROKIT_SAMPLES_SEEDS=N to check N more random feeds")
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_fault_shows_for_other_random_feeds(entry):
    generator = _load_generator()
    model = onnx.load(str(SAMPLES / entry["file"]))
    from reprokit.engine.backends.emulate import emulate_model, round_through

    emulated = emulate_model(model, "fp16")
    for seed in range(1, 1 + int(os.environ["REPROKIT_SAMPLES_SEEDS"])):
        feeds = generator.random_feeds(model, seed)
        ref = _run(model, feeds)
        assert all(np.isfinite(v).all() for v in ref.values())
        target = _run(emulated, {k: round_through(v, "fp16") for k, v in feeds.items()})
        assert _verdict(ref, target) == entry["expected"]["emulate:fp16"], seed
