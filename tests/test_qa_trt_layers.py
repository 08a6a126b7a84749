"""fp32-nodes as TensorRT's ONNX parser names the layers, read on a real parser (TensorRT-RTX 1.7's,
onnx-tensorrt's: tests/golden/trt_layer_names.txt, from scripts/trt_layer_models.py's models). A
node's first layer is NODE, its later ones NODE_<counter> (Gemm ``ln_2`` with a bias: ``ln_2`` and
``ln_2_8``), an unnamed node's ``node_of_<first output>``; ``[ONNX Layer: NAME]`` metadata names
the origin. Found on e970ed4 and on hqa's 3b3eb5d (each test fails there):

- the printed weakly typed polygraphy line pinned ``--layer-precisions ln_2:float32``: the bias
  layer ``ln_2_8`` stayed fp16 where reprokit's build and repro.py pin every layer of the node;
- the printed trtexec line did the same with ``--layerPrecisions=ln_2:fp32``;
- the trt backend refused ``fp32-nodes=Mul_3`` (OP_INDEX, an unnamed node), which the CLI, the
  emulator and repro.py accept ("names no node of the model").

No TensorRT runs on this machine: the network the parser made is rebuilt from the golden rows
(names, metadata, output types) and handed to the code under test (polygraphy's own script loader
with the archive's repro.py, the backend's postprocess step).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import extract_data, run_cli
from test_trt_commands import polygraphy_lines, polygraphy_parses

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "trt_layer_names.txt"
FLOAT, HALF = "DataType.FLOAT", "DataType.HALF"
FAKE_TRT = SimpleNamespace(float32=FLOAT, float16=HALF)  # the data types layers compare against


class _Layer:
    """One parsed layer as the golden file records it: name, metadata and output types."""

    def __init__(self, name: str, metadata: str, dtypes: list[str]):
        self.name, self.metadata, self.precision = name, metadata, None
        self._outs = [SimpleNamespace(dtype=d) for d in dtypes]
        self.output_types: dict[int, str] = {}

    @property
    def num_outputs(self) -> int:
        return len(self._outs)

    def get_output(self, i):
        return self._outs[i]

    def set_output_type(self, i, dtype):
        self.output_types[i] = dtype


def golden_network(model: str, metadata: bool = True) -> list[_Layer]:
    """The layers TensorRT-RTX 1.7's parser made from ``model`` (a file of
    scripts/trt_layer_models.py); ``metadata=False``: as a parser before TensorRT 10 (none)."""
    text = GOLDEN.read_text()
    block = text.split(f"== {model} parsed=True\n", 1)[1].split("\n==", 1)[0]
    layers = []
    for row in block.splitlines():
        _, name, _, meta, outs = row.strip().split("\t")
        dtypes = re.findall(r":(DataType\.\w+)'", outs)
        layers.append(_Layer(eval(name), eval(meta.split("=", 1)[1]) if metadata else "", dtypes))
    return layers


def pinned(network: list[_Layer]) -> set[str]:
    return {layer.name for layer in network if layer.precision == FLOAT}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """scripts/trt_layer_models.py's models, the ones the golden file's parser read."""
    folder = tmp_path_factory.mktemp("trt-layer-models")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trt_layer_models.py"), str(folder)], check=True
    )
    return folder


@pytest.fixture(scope="module")
def archive(models):
    """An emulate:fp16 archive of prefix.onnx keeping the Gemm ``ln_2`` and the unnamed Mul
    (``Mul_3``) in fp32; --tol 1e-6 so the remaining fp16 LayerNorms diverge."""
    root = models
    np.savez(root / "in.npz", x=np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32))
    target = "emulate:fp16,fp32-nodes=ln_2;Mul_3"
    done = run_cli("pack", "prefix.onnx", "--inputs", "in.npz", "--target", target, "--tol", "1e-6",
                   "-o", "p.tar.gz", cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(root / "p.tar.gz") as tar:
        extract_data(tar, root / "x")
    return next(p for p in (root / "x").iterdir() if p.is_dir())


def test_the_golden_parser_names_a_node_s_later_layers_with_a_counter():
    names = [layer.name for layer in golden_network("prefix.onnx")]
    assert {"ln", "ln_1", "ln_2", "ln_2_8", "node_of_y"} <= set(names)
    origins = {x.name: x.metadata for x in golden_network("gemm_bias.onnx") if x.metadata}
    assert origins == {"fc": "[ONNX Layer: fc]", "fc_0": "[ONNX Layer: fc]"}


def test_the_printed_polygraphy_line_pins_every_layer_of_the_kept_nodes(archive, monkeypatch):
    """What the weakly typed polygraphy line pins on the parsed network: its --layer-precisions
    names (polygraphy matches layer names exactly) and its --trt-network-postprocess-script, run
    through polygraphy's own script loader on the archive's repro.py."""
    from polygraphy.backend.common import InvokeFromScript

    weak = [
        line
        for line in polygraphy_lines((archive / "commands.sh").read_text())
        if "--strongly-typed" not in line
    ]
    assert weak
    monkeypatch.chdir(archive)  # the printed line runs in the archive's folder
    monkeypatch.setitem(sys.modules, "tensorrt", FAKE_TRT)  # the weakly typed form's module
    for line in weak:
        args = polygraphy_parses(line)
        assert args.precision_constraints == "obey", line
        network = golden_network("prefix.onnx")
        for spec in args.layer_precisions or []:
            name, _, _ = spec.rpartition(":")
            for layer in network:
                if layer.name == name:
                    layer.precision = FLOAT
        for script in args.trt_network_postprocess_script or []:
            path, _, func = script.partition(":")
            InvokeFromScript(path, func or "postprocess")(network=network)
        assert pinned(network) == {"ln_2", "ln_2_8", "node_of_y"}, line


def test_the_printed_trtexec_line_never_pins_part_of_a_node(archive):
    """An emulate archive: no TensorRT parsed the model, so the later layer names are unknown and
    trtexec (names only) is not printed for the kept nodes; it says why. An archive of a weakly
    typed TensorRT build names every layer that build pinned."""
    from reprokit.report.trtcommands import trt_forms
    from reprokit.spec import parse_target
    from reprokit.standalone.compare import Criterion

    commands = (archive / "commands.sh").read_text()
    assert "--layerPrecisions" not in commands
    assert "#    trtexec: trtexec pins layers by name" in commands
    spec = parse_target("trt:fp16,fp32-nodes=ln_2;Mul_3")
    weak, _ = trt_forms(spec, Criterion(), {"x": "inputs/input_0.bin"}, built_typing="weakly-typed",
                        qdq=False, pinned={"ln_2": ["ln_2", "ln_2_8"], "Mul_3": ["node_of_y"]})  # fmt: skip
    assert "--layerPrecisions=ln_2:fp32,ln_2_8:fp32,node_of_y:fp32" in shlex.split(weak.trtexec)


@pytest.mark.parametrize("metadata", [True, False], ids=["trt10-metadata", "trt8.6-names"])
def test_the_trt_backend_pins_an_op_index_node_and_every_layer(models, metadata):
    import onnx

    from reprokit.engine.backends import trt as trt_backend
    from reprokit.engine.backends.trt_setup import fp32_origins

    model = onnx.load(models / "prefix.onnx")
    origins = fp32_origins(model, ("ln_2", "Mul_3"))
    assert origins == {"ln_2": "ln_2", "Mul_3": "node_of_y"}
    matched: dict[str, list[str]] = {}
    network = golden_network("prefix.onnx", metadata)
    trt_backend._pin_fp32(FAKE_TRT, origins, trt_backend._parser_origins(model), matched)(network)
    assert pinned(network) == {"ln_2", "ln_2_8", "node_of_y"}
    assert matched == {"ln_2": ["ln_2", "ln_2_8"], "Mul_3": ["node_of_y"]}
    network = golden_network(
        "prefix.onnx", metadata
    )  # node ln alone: never ln_1, node ln_1's layer
    trt_backend._pin_fp32(
        FAKE_TRT, fp32_origins(model, ["ln"]), trt_backend._parser_origins(model), {}
    )(network)
    assert pinned(network) == {"ln"}


def test_the_trt_backend_refuses_a_name_that_is_no_node(models):
    import onnx

    from reprokit.engine.backends.trt_setup import fp32_origins
    from reprokit.errors import InputError

    with pytest.raises(InputError, match="names no node of the model: Mul_2"):
        fp32_origins(onnx.load(models / "prefix.onnx"), ["Mul_2"])  # position 2 is the Gemm ln_2
