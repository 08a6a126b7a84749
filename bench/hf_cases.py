"""Realistic numeric cases for the benchmarks and tests (issue 39): torch exports of real
architectures from ``transformers`` configs (random weights, seed 0, no hub), with a planted
overflow or an accumulated drift, and the numeric ``cmd:`` check a TensorRT user wires (a runner
script that loads the ONNX file it is given, runs it, writes its outputs).

    python bench/hf_cases.py            # export (cached) and print each case's node count

Exports are cached in ``bench/.cache/hf`` (git-ignored; ``HF_CASES_CACHE`` moves it), keyed by
the case name and the versions of torch and transformers. Nothing here runs reprokit's search.

Cases (each ≥ 150 nodes, opset 17, static shapes, torch's legacy exporter):
  efficientnet  EfficientNetModel, width 0.25 / depth 0.3 (pixel_values 1x3x64x64)
  mobilenetv2   MobileNetV2Model, depth multiplier 0.35 (pixel_values 1x3x64x64)
  bert          BertModel, 3 layers, hidden 64, 2 heads (input_ids 1x16)

Planted overflow: ``x → Mul(k) → Div(k)`` inserted after one float tensor in the middle of the
graph (k = 4·65504 / max|x|): exact in fp32, Inf in fp16 storage — the minimal is that one Mul.
Accumulated drift: the unchanged export under bf16 storage, judged at a tight rel-L2 tolerance
(no node fails alone at it; the error adds up through the layers).
"""

from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("HF_CASES_CACHE", os.path.join(ROOT, "bench", ".cache", "hf"))
OPSET = 17
FP16_MAX = 65504.0

# The runner script of a numeric cmd: check: loads {model}, runs it with reprokit's fp16/bf16
# storage emulator (standing in for the user's engine), writes {outputs}. argv: model inputs
# outputs [precision]; CALLS_LOG (if set) gets one line per call.
RUNNER = """\
import os
import sys

import numpy as np

from reprokit.engine.backends import create_backend
from reprokit.spec import parse_target

model, inputs, outputs = sys.argv[1:4]
precision = sys.argv[4] if len(sys.argv) > 4 else "fp16"
if os.environ.get("CALLS_LOG"):
    with open(os.environ["CALLS_LOG"], "a") as handle:
        handle.write(model + "\\n")
with np.load(inputs) as data:
    feeds = {k: data[k] for k in data.files}
values = create_backend(parse_target("emulate:" + precision)).run(model, feeds, None).outputs
np.savez(outputs, **values)
"""


def write_runner(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "runner.py")
    with open(path, "w") as handle:
        handle.write(RUNNER)
    return path


def cmd_target(runner: str, precision: str = "fp16") -> str:
    """The numeric check as a ``--target``: the precision sets the default tolerance."""
    return f"cmd:precision={precision}:{sys.executable} {runner} {{model}} {{inputs}} {{outputs}} {precision}"


def _configs():
    import transformers as tf

    return {
        "efficientnet": (
            lambda: tf.EfficientNetModel(
                tf.EfficientNetConfig(
                    width_coefficient=0.25, depth_coefficient=0.3, image_size=64, hidden_dim=320
                )
            ),
            "pixel_values",
            (1, 3, 64, 64),
        ),
        "mobilenetv2": (
            lambda: tf.MobileNetV2Model(
                tf.MobileNetV2Config(depth_multiplier=0.35, image_size=64, tf_padding=False)
            ),
            "pixel_values",
            (1, 3, 64, 64),
        ),
        "bert": (
            lambda: tf.BertModel(
                tf.BertConfig(
                    num_hidden_layers=3,
                    hidden_size=64,
                    num_attention_heads=2,
                    intermediate_size=128,
                    vocab_size=500,
                    max_position_embeddings=64,
                )
            ),
            "input_ids",
            (1, 16),
        ),
    }


CASES = ("efficientnet", "mobilenetv2", "bert")


def _versions() -> str:
    import torch
    import transformers

    return f"torch{torch.__version__.split('+')[0]}-tf{transformers.__version__}"


def export(name: str, cache: str = CACHE) -> tuple[str, str]:
    """(model.onnx, inputs.npz) of the unchanged export, cached."""
    folder = os.path.join(cache, f"{name}-{_versions()}-v6")
    model_path, inputs_path = os.path.join(folder, "model.onnx"), os.path.join(folder, "inputs.npz")
    if os.path.exists(model_path) and os.path.exists(inputs_path):
        return model_path, inputs_path
    import torch

    make, key, shape = _configs()[name]
    torch.manual_seed(0)
    net = make().eval()
    if key == "pixel_values":  # transformers' init fades a CNN's activations to 0: Kaiming convs,
        for module in net.modules():  # BatchNorms of scale 1 with statistics from one batch
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight)
            if isinstance(
                module, torch.nn.BatchNorm2d
            ):  # transformers draws their scales at std 0.02
                module.reset_parameters()
                module.momentum = None  # a cumulative average: one batch sets it
        net.train()
        with torch.no_grad():
            net(**{key: torch.randn(8, *shape[1:])})
        net.eval()

    class Wrap(torch.nn.Module):  # one keyword input, one tensor output
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(**{key: x}).last_hidden_state

    rng = np.random.default_rng(0)
    if key == "input_ids":
        x = rng.integers(0, 500, shape).astype(np.int64)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    tmp = model_path + ".part"
    with torch.no_grad():
        torch.onnx.export(
            Wrap().eval(),
            (torch.from_numpy(x),),
            tmp,
            input_names=[key],
            output_names=["hidden"],
            opset_version=OPSET,
            dynamo=False,
        )
    np.savez(inputs_path, **{key: x})
    os.replace(tmp, model_path)
    return model_path, inputs_path


def _activations(model, feeds: dict) -> dict:
    """Every float tensor of one onnxruntime run (the models are small)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(marked)
    floats = {
        v.name
        for v in inferred.graph.value_info
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    have = {o.name for o in marked.graph.output}
    for node in marked.graph.node:
        for out in node.output:
            if out in floats and out not in have:
                marked.graph.output.append(
                    onnx.helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
                )
    session = ort.InferenceSession(marked.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def planted_overflow(name: str, cache: str = CACHE) -> tuple[str, str, str]:
    """(model.onnx, inputs.npz, the planted Mul's node name): the export with
    ``x → Mul(k) → Div(k)`` after a float tensor about 60% through the graph whose largest
    magnitude is at least 0.5 (k = 4·65504 / max|x|, so x·k passes fp16's range), cached."""
    import onnx

    base, inputs = export(name, cache)
    folder = os.path.dirname(base)
    path = os.path.join(folder, "planted_overflow.onnx")
    mul_name = "planted/overflow_mul"
    if os.path.exists(path):
        return path, inputs, mul_name
    original = onnx.load(base)
    with np.load(inputs) as data:
        feeds = {k: data[k] for k in data.files}
    values = _activations(original, feeds)
    nodes = list(original.graph.node)
    start = int(len(nodes) * 0.6)
    for position in list(range(start, len(nodes))) + list(range(start - 1, -1, -1)):
        node = nodes[position]
        tensor = node.output[0]
        if node.op_type not in _COMPUTE or tensor not in values or values[tensor].size < 2:
            continue
        if float(np.max(np.abs(values[tensor]))) < 0.5:
            continue
        model = _with_pair(
            original, position, tensor, mul_name, float(np.max(np.abs(values[tensor])))
        )
        if _overflows(model, feeds):  # the Inf reaches an output under fp16 storage
            break
    else:
        raise ValueError(f"{name}: no tensor where a planted overflow reaches an output")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path + ".part")
    os.replace(path + ".part", path)
    return path, inputs, mul_name


# Ops whose output is a float activation (no shape arithmetic).
_COMPUTE = {
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Relu",
    "Sigmoid",
    "Mul",
    "Clip",
    "Tanh",
    "Erf",
    "Div",
    "BatchNormalization",
    "Softmax",
    "Sub",
}


def _with_pair(original, position: int, tensor: str, mul_name: str, largest: float):
    """A copy of ``original`` with Mul(k) → Div(k) after node ``position``'s output ``tensor``."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(original)
    nodes = list(model.graph.node)
    k = np.float32(4 * FP16_MAX / largest)
    scaled, restored = "planted/scaled", "planted/restored"
    for node in nodes[position + 1 :]:  # later readers read the restored tensor
        for i, inp in enumerate(node.input):
            if inp == tensor:
                node.input[i] = restored
    for out in model.graph.output:
        if out.name == tensor:
            out.name = restored
    model.graph.initializer.append(numpy_helper.from_array(np.array(k, np.float32), "planted/k"))
    planted = [
        helper.make_node("Mul", [tensor, "planted/k"], [scaled], name=mul_name),
        helper.make_node("Div", [scaled, "planted/k"], [restored], name="planted/restore_div"),
    ]
    del model.graph.node[:]
    model.graph.node.extend(nodes[: position + 1] + planted + nodes[position + 1 :])
    return model


def _overflows(model, feeds: dict) -> bool:
    import tempfile

    import onnx

    from reprokit.engine.backends import create_backend
    from reprokit.spec import parse_target

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
        outputs = create_backend(parse_target("emulate:fp16")).run(path, feeds, None).outputs
    return any(not np.all(np.isfinite(v)) for v in outputs.values())


def node_count(path: str) -> int:
    import onnx

    return len(onnx.load(path, load_external_data=False).graph.node)


if __name__ == "__main__":
    for case in CASES:
        model_path, _ = export(case)
        planted_path, _, _ = planted_overflow(case)
        print(
            f"{case:14s} {node_count(model_path):5d} nodes  planted {node_count(planted_path):5d}  {planted_path}"
        )
