"""The TensorRT backend: spec options, validation, loader settings, and behaviour without TensorRT.

Building an engine needs TensorRT on a GPU (scripts/gpu-smoke.sh); everything up to that call
runs here for real: spec parsing, the pure ``builder_settings`` against polygraphy's real loader
signatures, polygraphy's real logger, the converted model a strongly typed build gets (run in
onnxruntime), and a real ``run`` that must fail with EngineUnavailable.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reprokit.engine.backends.base import BuildError
from reprokit.engine.backends.trt import TrtBackend
from reprokit.engine.backends.trt_setup import (
    builder_settings,
    capture_polygraphy_log,
    classify_failure,
)
from reprokit.errors import EngineUnavailable, UsageError
from reprokit.spec import parse_target

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
without_trt = pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here")
RNG = np.random.default_rng(3)


def mlp_file(tmp_path):
    # x[2,8] ─MatMul(W)─ mm ─Add(B)─ a ─Relu─ y
    w = numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "B"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w, b],
    )  # fmt: skip
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    return str(path), {"x": RNG.standard_normal((2, 8)).astype(np.float32)}


# -- spec parsing and validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "options"),
    [
        ("trt", ()),
        ("trt:fp16", (("fp16", True),)),
        ("trt:bf16", (("bf16", True),)),
        ("trt:int8", (("int8", True),)),
        ("trt:fp8", (("fp8", True),)),
        ("trt:no-tf32", (("no-tf32", True),)),
        ("trt:strongly-typed", (("strongly-typed", True),)),
        ("trt:opt-level=0", (("opt-level", 0),)),
        ("trt:opt-level=5", (("opt-level", 5),)),
        ("trt:workspace=2048", (("workspace", 2048),)),
        ("trt:timing-cache=/tmp/t.cache", (("timing-cache", "/tmp/t.cache"),)),
        (
            "trt:fp16,fp32-nodes=/ln/Add;/ln/Mul",
            (("fp16", True), ("fp32-nodes", "/ln/Add;/ln/Mul")),
        ),
        ("TRT: fp16 , no-tf32", (("fp16", True), ("no-tf32", True))),
    ],
)
def test_every_option_parses(text, options):
    spec = parse_target(text)
    assert spec.engine == "trt" and spec.options == options
    assert parse_target(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("trt:opt-level=6", "0 to 5"),
        ("trt:opt-level=-1", "0 to 5"),
        ("trt:opt-level=high", "integer"),
        ("trt:workspace=0", "positive"),
        ("trt:workspace=-5", "positive"),
        ("trt:strongly-typed,fp16,bf16", "fp16 or bf16"),
        ("trt:fp16,fp32-nodes=;", "names no node"),
        ("trt:fp32-nodes=a", "narrow precision"),
        ("trt:fp16=1", "takes no value"),
        ("trt:timing-cache", "needs a value"),
        ("trt:fp17", "unknown option"),
    ],
)
def test_contradictions_and_bad_values_are_usage_errors(text, words):
    with pytest.raises(UsageError, match=words) as caught:
        parse_target(text)
    assert caught.value.hint


def test_class_facts():
    assert TrtBackend.marking_changes_engine is True
    assert {doc.kind for doc in TrtBackend.OPTIONS.values()} == {"flag", "int", "str", "path"}
    assert TrtBackend.OPTIONS["timing-cache"].kind == "path"  # verify never takes one from an archive
    assert "reprokit[tensorrt]" in TrtBackend.install_hint


@pytest.mark.parametrize(
    ("text", "precision"),
    [
        ("trt", "tf32"),
        ("trt:no-tf32", "fp32"),
        ("trt:strongly-typed", "tf32"),
        ("trt:fp16", "fp16"),
        ("trt:bf16", "bf16"),
        ("trt:fp16,bf16", "bf16"),
        ("trt:int8", "int8"),
        ("trt:fp16,int8", "int8"),
        ("trt:fp8,fp16", "fp8"),
        ("trt:fp16,no-tf32", "fp16"),
    ],
)
def test_precision(text, precision):
    assert TrtBackend(parse_target(text)).precision() == precision


# -- builder settings (pure) --------------------------------------------------------------------


def settings(text, major, rtx=False):
    return builder_settings(parse_target(text), major, rtx)


@pytest.mark.parametrize("major", [8, 10])
def test_weak_typing_on_trt_8_6_to_10_uses_builder_flags(major):
    plain = settings("trt", major)
    assert plain.mode == "weakly-typed" and not plain.strongly_typed
    assert plain.create_config["tf32"] is True  # polygraphy clears TF32 unless asked
    assert plain.builder_flags == ("TF32",) and plain.convert_to is None

    fp16 = settings("trt:fp16,no-tf32", major)
    assert fp16.create_config == {
        "tf32": False,
        "fp16": True,
        "bf16": False,
        "int8": False,
        "fp8": False,
    }
    assert fp16.builder_flags == ("FP16",)

    pinned = settings("trt:fp16,int8,fp32-nodes=a;b", major)
    assert pinned.create_config["precision_constraints"] == "obey"
    assert pinned.fp32_layers and pinned.fp32_nodes == ("a", "b")
    assert pinned.builder_flags == ("TF32", "FP16", "INT8", "OBEY_PRECISION_CONSTRAINTS")


def test_strongly_typed_option_on_trt_10_converts_instead_of_flags():
    s = settings("trt:strongly-typed,fp16,fp32-nodes=a", 10)
    assert s.mode == "strongly-typed" and s.strongly_typed
    assert s.convert_to == "fp16" and s.fp32_nodes == ("a",) and not s.fp32_layers
    assert s.create_config == {"tf32": True}  # no precision flags at all
    assert s.config_loader == "CreateConfig"


def test_trt_11_is_always_strongly_typed():
    s = settings("trt:bf16,no-tf32", 11)
    assert s.mode == "strongly-typed" and s.strongly_typed and s.convert_to == "bf16"
    assert s.create_config == {"tf32": False} and s.builder_flags == ()
    assert settings("trt", 11).convert_to is None
    with pytest.raises(UsageError, match="fp16 or bf16"):
        settings("trt:fp16,bf16", 11)  # fine for weak typing, a contradiction here
    assert settings("trt:fp16,bf16", 10).create_config["bf16"] is True


def test_trt_11_int8_comes_from_qdq_and_fp32_nodes_without_conversion_is_noted():
    s = settings("trt:int8,fp32-nodes=a", 11)
    assert "fp8" not in s.create_config and "int8" not in s.create_config
    assert any("Q/DQ" in note for note in s.notes)
    assert any("fp32-nodes has no effect" in note for note in s.notes) and s.fp32_nodes == ()


def test_tensorrt_rtx_uses_create_config_rtx_on_the_current_gpu():
    s = settings("trt:fp16,no-tf32,opt-level=2", 1, rtx=True)
    assert s.mode == "strongly-typed" and s.strongly_typed and s.convert_to == "fp16"
    assert s.config_loader == "CreateConfigRTX"
    assert s.create_config == {"use_gpu": True, "builder_optimization_level": 2}
    assert s.config_flags == {"TF32": False}


def test_common_options_reach_the_loaders():
    s = settings("trt:opt-level=4,workspace=512,timing-cache=/tmp/x.cache", 10)
    assert s.create_config["builder_optimization_level"] == 4
    assert s.create_config["load_timing_cache"] == "/tmp/x.cache"
    assert s.save_timing_cache == "/tmp/x.cache"
    assert s.workspace_bytes == 512 * 2**20
    assert settings("trt", 10).workspace_bytes is None


def test_too_old_tensorrt_is_unavailable():
    with pytest.raises(EngineUnavailable, match="8.6"):
        settings("trt", 7)


@pytest.mark.parametrize(
    ("text", "major", "rtx"),
    [
        ("trt:fp16,bf16,int8,fp8,no-tf32,fp32-nodes=a", 10, False),  # 8.6 has no BF16: refused
        ("trt:fp16,int8,no-tf32,fp32-nodes=a", 8, False),
        ("trt:opt-level=3,workspace=64,timing-cache=/tmp/c", 10, False),
        ("trt:fp16,opt-level=1,timing-cache=/tmp/c", 11, False),
        ("trt:bf16,opt-level=1,timing-cache=/tmp/c", 1, True),
    ],
)
def test_settings_bind_to_the_installed_polygraphy_loaders(text, major, rtx):
    from polygraphy.backend.tensorrt_rtx import CreateConfigRTX
    from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath

    s = settings(text, major, rtx)
    loader = {"CreateConfig": CreateConfig, "CreateConfigRTX": CreateConfigRTX}[s.config_loader]
    inspect.signature(loader).bind(**s.create_config, memory_pool_limits={}, profiles=[])
    inspect.signature(NetworkFromOnnxPath).bind("m.onnx", strongly_typed=s.strongly_typed)
    inspect.signature(EngineFromNetwork).bind(
        None, config=None, save_timing_cache=s.save_timing_cache
    )


# -- without TensorRT ---------------------------------------------------------------------------


def test_import_does_not_import_tensorrt_or_polygraphys_trt_backend():
    code = textwrap.dedent(
        """
        import sys
        import reprokit.engine.backends.trt as trt_backend
        from reprokit.spec import parse_target
        trt_backend.builder_settings(parse_target("trt:fp16"), 10, False)
        heavy = [m for m in sys.modules if m.split(".")[0] in ("tensorrt", "tensorrt_rtx")
                 or m.startswith("polygraphy.backend.trt") or m == "onnxruntime"]
        print(heavy)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@without_trt
def test_run_without_tensorrt_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("POLYGRAPHY_USE_TENSORRT_RTX", raising=False)
    path, feeds = mlp_file(tmp_path)
    with pytest.raises(EngineUnavailable) as caught:
        TrtBackend(parse_target("trt:fp16")).run(path, feeds, None)
    assert "tensorrt" in caught.value.message.lower()
    assert "pip install 'reprokit[tensorrt]'" in caught.value.hint


@without_trt
def test_run_asking_for_tensorrt_rtx_names_its_wheels(tmp_path, monkeypatch):
    if importlib.util.find_spec("tensorrt_rtx") or importlib.util.find_spec(
        "tensorrt_rtx_bindings"
    ):
        pytest.skip("TensorRT-RTX is installed here")
    monkeypatch.setenv("POLYGRAPHY_USE_TENSORRT_RTX", "1")
    path, feeds = mlp_file(tmp_path)
    with pytest.raises(EngineUnavailable) as caught:
        TrtBackend(parse_target("trt")).run(path, feeds, None)
    assert "TensorRT-RTX" in caught.value.message
    assert "pip install tensorrt-rtx-cu13 " in caught.value.hint  # the wrapper whose module polygraphy imports


@without_trt
def test_probe_says_not_available_and_how_to_install(monkeypatch):
    monkeypatch.delenv("POLYGRAPHY_USE_TENSORRT_RTX", raising=False)
    found = TrtBackend.probe()
    assert not found.available and found.version is None
    assert "TensorRT is not importable" in found.detail and "tensorrt" in found.detail
    # the CLI prints install_hint beside the detail: both flavours are named there
    assert "reprokit[tensorrt]" in TrtBackend.install_hint
    assert "pip install tensorrt-rtx-cu13 " in TrtBackend.install_hint
    monkeypatch.setenv("POLYGRAPHY_USE_TENSORRT_RTX", "1")
    if not (
        importlib.util.find_spec("tensorrt_rtx")
        or importlib.util.find_spec("tensorrt_rtx_bindings")
    ):
        rtx = TrtBackend.probe()
        assert not rtx.available and "tensorrt-rtx-cu13 " in rtx.detail


def test_rtx_bindings_wheel_is_aliased_for_polygraphy(tmp_path):
    """With only ``tensorrt_rtx_bindings`` importable, polygraphy's lazy import must find it.

    A stand-in module plays the bindings wheel (which needs a GPU); what is under test is
    reprokit's aliasing and polygraphy's real module selection.
    """
    (tmp_path / "tensorrt_rtx_bindings.py").write_text('__version__ = "1.2.0.4"\n')
    code = textwrap.dedent(
        """
        from reprokit.engine.backends.trt import TrtBackend
        from reprokit.engine.backends.trt_setup import load_tensorrt
        module, rtx = load_tensorrt()
        from polygraphy.mod.trt_importer import lazy_import_trt
        print(rtx, module.__name__, lazy_import_trt().__version__)
        print(TrtBackend.probe())
        """
    )
    env = dict(os.environ, POLYGRAPHY_USE_TENSORRT_RTX="1")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first == "True tensorrt_rtx_bindings 1.2.0.4"
    assert "available=True" in second and "TensorRT-RTX 1.2.0.4" in second


# -- failures: polygraphy's real logger, classified ---------------------------------------------


def test_polygraphy_messages_are_captured_and_become_build_errors():
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    with capture_polygraphy_log() as log:
        G_LOGGER.info("building")
        G_LOGGER.error("[TRT] In node 0 (importFoo): UNSUPPORTED_NODE: No importer for Foo")
        with pytest.raises(PolygraphyException) as raised:
            G_LOGGER.critical("Could not parse ONNX correctly")
    assert "building" in log.text()
    error = classify_failure([*log.errors(), str(raised.value)])
    assert isinstance(error, BuildError)
    assert "No importer for Foo" in error.message and "Could not parse ONNX" in error.message
    assert not G_LOGGER.use_python_logging_system  # restored


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Target GPU SM 70 is not supported by this TensorRT release.", EngineUnavailable),
        (
            "createInferBuilder: Error Code 6: API Usage Error (CUDA initialization failure with error: 35.)",
            EngineUnavailable,
        ),
        ("In node 2 (importConv): UNSUPPORTED_NODE: datatype not supported on device", BuildError),
        ("Could not find any implementation for node /conv/Conv.", BuildError),
    ],
)
def test_gpu_refusals_and_model_refusals_are_told_apart(message, kind):
    assert type(classify_failure([message])) is kind


def test_a_gpu_tensorrt_rtx_refuses_is_unavailable_not_a_build_error():
    error = classify_failure(
        [
            "[TRT] Error Code 1: TensorRT-RTX does not support compute capability 9.0",
            "Invalid Engine.",
        ],
        rtx=True,
    )
    assert isinstance(error, EngineUnavailable) and not isinstance(error, BuildError)
    assert "compute capability 9.0" in error.message and "POLYGRAPHY_USE_TENSORRT_RTX" in error.hint
    missing = classify_failure(["bf16 in CreateConfig is not available on TensorRT version 8.6.1."])
    assert isinstance(missing, EngineUnavailable)


# -- up to the engine call, on the CPU -----------------------------------------------------------
# Building and running an engine needs an NVIDIA GPU: scripts/gpu-smoke.sh does that on one (builds,
# timing cache, TensorRT's own error messages). Here, what reprokit hands TensorRT is checked for
# real: the converted model a strongly typed build gets must compute what the original does.


@pytest.mark.parametrize(
    ("text", "major", "kept"),
    [("trt:fp16", 11, ()), ("trt:strongly-typed,fp16", 10, ()), ("trt:fp16,fp32-nodes=add", 11, ("add",))],
)
def test_the_model_a_strongly_typed_build_gets_matches_onnxruntime(tmp_path, text, major, kept):
    from reprokit.engine.backends.ort import OrtBackend

    path, feeds = mlp_file(tmp_path)
    s = settings(text, major)
    assert s.convert_to == "fp16" and s.fp32_nodes == kept
    meta = {"notes": []}
    converted = TrtBackend._convert(path, s, str(tmp_path), meta)
    model = onnx.load(converted)
    onnx.checker.check_model(model, full_check=True)
    graph_types = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert graph_types == {"x": TensorProto.FLOAT, "y": TensorProto.FLOAT}  # graph I/O types kept
    weights = {t.name: t.data_type for t in model.graph.initializer}
    assert weights["W"] == TensorProto.FLOAT16
    assert weights["B"] == (TensorProto.FLOAT if kept else TensorProto.FLOAT16)
    reference = OrtBackend(parse_target("ort")).run(path, feeds, None).outputs["y"]
    narrow = OrtBackend(parse_target("ort")).run(converted, feeds, None).outputs["y"]
    np.testing.assert_allclose(narrow, reference, rtol=1e-2, atol=1e-2)
