"""Pass/fail cases of realistic size for bench/bench_passfail.py (issue 39): models exported from
transformers' own architectures (MobileNetV2, BERT, ViT: configs, random weights, seed 0, no hub
download) with torch's ONNX exporter at opset 17, and check scripts that fail the way a TensorRT
build does:

- a Conv→Clip fusion deep in MobileNetV2 that fails to build only while the Conv's output is read
  by its Clip alone (marking the tensor prevents the fusion), saying nothing of where;
- two distant nodes of BERT (an attention Softmax of the first layer, the output dense MatMul of
  the last) that fail only together, saying nothing;
- a parser message naming one node of ViT by its index and name (TensorRT's "In node N with name:
  … and operator: …"), the index that of the model the check was given;
- an operator present: BERT's GELU ``Erf`` refused by name of operator only, any ``Erf`` node
  fails.

Exports are cached under ``bench/.cache/hf_passfail`` (git-ignored; ``--fresh`` in the bench
rebuilds them). Needs ``transformers`` and ``torch`` (the ``bench`` extra); without them the bench
says so and runs its other rows. Owns no timing and no judgement: the bench does both.
"""

from __future__ import annotations

import os

import numpy as np

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "hf_passfail")
SEED = 0

# Fails while the named Conv's output is read by exactly one Clip and is no graph output.
FUSION_AT_CHECKER = '''\
"""A builder whose fusion of one Conv with its Clip is broken (exit status only)."""
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
conv = sys.argv[2]
outputs = {o.name for o in graph.output}
for node in graph.node:
    if node.name == conv and node.op_type == "Conv" and node.output[0] not in outputs:
        using = [n for n in graph.node if node.output[0] in n.input]
        if len(using) == 1 and using[0].op_type == "Clip":
            print("[E] [TRT] engine build failed")
            sys.exit(1)
'''

# TensorRT's parser words for one node it cannot import, naming it by index and name.
NAMED_NODE_CHECKER = '''\
"""Prints what TensorRT's ONNX parser says about a node it cannot import, and fails."""
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
for index, node in enumerate(graph.node):
    if node.name == sys.argv[2]:
        print(f"[E] [TRT] ModelImporter.cpp:949: While parsing node number {index} [{node.op_type} -> \\"{node.output[0]}\\"]:")
        print(f"[E] [TRT] In node {index} with name: {node.name} and operator: {node.op_type} (parseNode): "
              "INVALID_NODE: Assertion failed: inputs.at(0).is_tensor()")
        sys.exit(1)
'''

# An operator the engine does not have: any node of that type fails the build.
OP_PRESENT_CHECKER = '''\
"""Fails while any node of the given operator type is in the model, naming the operator only."""
import sys
import onnx
graph = onnx.load(sys.argv[1]).graph
if any(node.op_type == sys.argv[2] for node in graph.node):
    print(f"[E] [TRT] No importer registered for op: {sys.argv[2]}")
    sys.exit(1)
'''


def _export(module, example, path: str, input_name: str) -> None:
    import torch

    class Tensor(torch.nn.Module):  # one keyword input, one tensor output
        def __init__(self):
            super().__init__()
            self.net = module

        def forward(self, x):
            out = self.net(**{input_name: x})
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

    with torch.no_grad():
        torch.onnx.export(
            Tensor().eval(),
            (example,),
            path,
            input_names=[input_name],
            output_names=["y"],
            opset_version=17,
            dynamo=False,
        )


def models(cache: str = CACHE) -> dict[str, tuple[str, str]]:
    """name → (model.onnx, inputs.npz), exported once into ``cache``."""
    made = {}
    for name, make in (("mobilenetv2", _mobilenetv2), ("bert4", _bert), ("vit4", _vit)):
        path, feeds = os.path.join(cache, f"{name}.onnx"), os.path.join(cache, f"{name}.inputs.npz")
        if not (os.path.exists(path) and os.path.exists(feeds)):
            os.makedirs(cache, exist_ok=True)
            example = make(path)
            np.savez(feeds, **example)
        made[name] = (path, feeds)
    return made


def _mobilenetv2(path: str) -> dict:
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(SEED)
    net = MobileNetV2ForImageClassification(
        MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    ).eval()
    x = torch.randn(1, 3, 64, 64)
    _export(net, x, path, "pixel_values")
    return {"pixel_values": x.numpy()}


def _bert(path: str) -> dict:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    net = BertModel(
        BertConfig(
            num_hidden_layers=4,
            hidden_size=64,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=500,
            max_position_embeddings=64,
        )
    ).eval()
    ids = torch.randint(0, 500, (1, 16))
    _export(net, ids, path, "input_ids")
    return {"input_ids": ids.numpy()}


def _vit(path: str) -> dict:
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(SEED)
    net = ViTModel(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=128,
        ),
        add_pooling_layer=False,
    ).eval()
    x = torch.randn(1, 3, 32, 32)
    _export(net, x, path, "pixel_values")
    return {"pixel_values": x.numpy()}


def _nodes(path: str):
    import onnx

    return list(onnx.load(path, load_external_data=False).graph.node)


def scenarios(work: str, python: str, write_checker, cache: str = CACHE) -> list[dict]:
    """The four rows, in bench_passfail's case format (``expect``: the node names that are right)."""
    found = models(cache)
    fusion = write_checker(work, "fusion_at_checker.py", FUSION_AT_CHECKER)
    named = write_checker(work, "named_node_checker.py", NAMED_NODE_CHECKER)
    present = write_checker(work, "op_present_checker.py", OP_PRESENT_CHECKER)
    rows = []

    mobile = found["mobilenetv2"]
    nodes = _nodes(mobile[0])
    readers = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    pairs = [
        (n, readers[n.output[0]][0])
        for n in nodes
        if n.op_type == "Conv"
        and len(readers.get(n.output[0], [])) == 1
        and readers[n.output[0]][0].op_type == "Clip"
    ]
    conv, clip = pairs[(2 * len(pairs)) // 3]  # deep in the network, two thirds down
    rows.append(
        {
            "name": f"MobileNetV2 Conv→Clip fusion, silent ({len(nodes)} nodes)",
            "model": mobile,
            "expect": sorted([conv.name, clip.name]),
            "check": [python, fusion, "{model}", conv.name],
        }
    )

    bert = found["bert4"]
    nodes = _nodes(bert[0])
    first = next(n.name for n in nodes if n.op_type == "Softmax")
    last = [n.name for n in nodes if n.op_type == "MatMul" and "/output/dense/" in n.name][-1]
    rows.append(
        {
            "name": f"BERT distant pair, silent ({len(nodes)} nodes)",
            "model": bert,
            "expect": sorted([first, last]),
            "check": [
                python,
                os.path.join(work, "fake_reduce_checker.py"),
                "{model}",
                "--fail-node",
                first,
                last,
            ],
        }
    )

    vit = found["vit4"]
    nodes = _nodes(vit[0])
    softmax = [n.name for n in nodes if n.op_type == "Softmax"]
    target = softmax[len(softmax) // 2]
    rows.append(
        {
            "name": f"ViT parser names a Softmax ({len(nodes)} nodes)",
            "model": vit,
            "expect": [target],
            "check": [python, named, "{model}", target],
        }
    )

    nodes = _nodes(bert[0])
    rows.append(
        {
            "name": f"BERT has an Erf (op present, {len(nodes)} nodes)",
            "model": bert,
            "expect": "one Erf",
            "check": [python, present, "{model}", "Erf"],
        }
    )
    return rows
