"""Splice one ONNX construct into a model, keeping it on the data path.

    python scripts/splice_construct.py BASE.onnx CONSTRUCT OUT.onnx [--at TENSOR]

The construct reads a 4-D float tensor T of the base model (square in its last two dims) and its
result r is folded back as T' = T + 0·mean(r), so the construct stays live but the numbers do not
change. Used to build models that an engine refuses to parse or build (scripts/gpu-smoke.sh).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CONSTRUCTS = ["Unique", "Det", "DFT", "STFT", "Col2Im", "MaxUnpool", "BitShift", "ConcatFromSequence",
              "CenterCropPad", "Bernoulli"]


def _construct(kind: str, t: str, shape: list[int], p: str):
    """Nodes and initializers computing a float tensor from ``t``; returns (nodes, inits, out)."""
    n, c, h, w = shape
    nodes, inits = [], []

    def const(name, value, dtype=np.int64):
        inits.append(numpy_helper.from_array(np.array(value, dtype=dtype), f"{p}/{name}"))
        return f"{p}/{name}"

    if kind == "Unique":
        nodes.append(helper.make_node("Flatten", [t], [f"{p}/flat"], axis=0, name=f"{p}/flatten"))
        nodes.append(helper.make_node("Unique", [f"{p}/flat"], [f"{p}/out"], sorted=1, name=f"{p}/unique"))
    elif kind == "Det":
        nodes.append(helper.make_node("Det", [t], [f"{p}/out"], name=f"{p}/det"))
    elif kind == "DFT":
        nodes.append(helper.make_node("Unsqueeze", [t, const("ax", [-1])], [f"{p}/real"], name=f"{p}/unsqueeze"))
        nodes.append(helper.make_node("DFT", [f"{p}/real"], [f"{p}/out"], axis=3, name=f"{p}/dft"))
    elif kind == "STFT":
        nodes.append(helper.make_node("Reshape", [t, const("shape", [1, -1])], [f"{p}/signal"], name=f"{p}/reshape"))
        nodes.append(helper.make_node("STFT", [f"{p}/signal", const("step", 8), "", const("len", 16)],
                                      [f"{p}/out"], name=f"{p}/stft"))
    elif kind == "Col2Im":
        nodes.append(helper.make_node("Reshape", [t, const("shape", [1, c * 4, -1])], [f"{p}/cols"], name=f"{p}/reshape"))
        nodes.append(helper.make_node("Col2Im", [f"{p}/cols", const("img", [h, w // 4 + 1]), const("blk", [1, 1])],
                                      [f"{p}/out"], name=f"{p}/col2im"))
    elif kind == "MaxUnpool":
        nodes.append(helper.make_node("MaxPool", [t], [f"{p}/pooled", f"{p}/idx"], kernel_shape=[2, 2],
                                      strides=[2, 2], name=f"{p}/maxpool"))
        nodes.append(helper.make_node("MaxUnpool", [f"{p}/pooled", f"{p}/idx"], [f"{p}/out"], kernel_shape=[2, 2],
                                      strides=[2, 2], name=f"{p}/maxunpool"))
    elif kind == "BitShift":
        nodes.append(helper.make_node("Cast", [t], [f"{p}/u"], to=TensorProto.UINT32, name=f"{p}/cast_u"))
        nodes.append(helper.make_node("BitShift", [f"{p}/u", const("one", 1, np.uint32)], [f"{p}/shifted"],
                                      direction="LEFT", name=f"{p}/bitshift"))
        nodes.append(helper.make_node("Cast", [f"{p}/shifted"], [f"{p}/out"], to=TensorProto.FLOAT, name=f"{p}/cast_f"))
    elif kind == "ConcatFromSequence":
        nodes.append(helper.make_node("SequenceConstruct", [t, t], [f"{p}/seq"], name=f"{p}/seq_construct"))
        nodes.append(helper.make_node("ConcatFromSequence", [f"{p}/seq"], [f"{p}/out"], axis=1, name=f"{p}/concat_seq"))
    elif kind == "CenterCropPad":
        nodes.append(helper.make_node("CenterCropPad", [t, const("crop", [n, c, h // 2, w // 2])], [f"{p}/out"],
                                      name=f"{p}/center_crop_pad"))
    elif kind == "Bernoulli":
        nodes.append(helper.make_node("Sigmoid", [t], [f"{p}/prob"], name=f"{p}/sigmoid"))
        nodes.append(helper.make_node("Bernoulli", [f"{p}/prob"], [f"{p}/out"], seed=0.0, name=f"{p}/bernoulli"))
    else:
        raise SystemExit(f"unknown construct {kind}; one of {', '.join(CONSTRUCTS)}")
    return nodes, inits, f"{p}/out"


def splice(model, kind: str, at: str | None = None):
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in inferred.graph.value_info if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    candidates = [o for node in model.graph.node for o in node.output
                  if len(shapes.get(o, [])) == 4 and shapes[o][2] == shapes[o][3] and shapes[o][2] >= 4]
    if at is None:
        at = candidates[len(candidates) // 2]
    if at not in shapes:
        raise SystemExit(f"{at} is not a 4-D float tensor of the model")
    p = f"splice/{kind.lower()}"
    nodes, inits, out = _construct(kind, at, shapes[at], p)
    zero = numpy_helper.from_array(np.array(0.0, np.float32), f"{p}/zero")
    kept = f"{at}__spliced"
    tail = [
        helper.make_node("Cast", [out], [f"{p}/out_f"], to=TensorProto.FLOAT, name=f"{p}/to_float"),
        helper.make_node("ReduceMean", [f"{p}/out_f"], [f"{p}/mean"], keepdims=0, name=f"{p}/mean"),
        helper.make_node("Mul", [f"{p}/mean", f"{p}/zero"], [f"{p}/nothing"], name=f"{p}/times_zero"),
        helper.make_node("Add", [kept, f"{p}/nothing"], [at], name=f"{p}/fold_back"),
    ]
    graph = model.graph
    new_nodes = []
    for node in graph.node:
        node.output[:] = [kept if o == at else o for o in node.output]
        new_nodes.append(node)
        if kept in node.output:
            new_nodes.extend(n for n in nodes)
            new_nodes.extend(tail)
    for node in nodes:  # the construct reads the tensor before the fold-back
        node.input[:] = [kept if i == at else i for i in node.input]
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(inits + [zero])
    del graph.value_info[:]
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("construct", choices=CONSTRUCTS)
    parser.add_argument("out")
    parser.add_argument("--at", default=None, help="tensor to read (default: a 4-D square one mid-graph)")
    parser.add_argument("--opset", type=int, default=None, help="raise the model's opset (DFT/STFT need 17+)")
    args = parser.parse_args(argv)
    model = splice(onnx.load(args.base), args.construct, args.at)
    if args.opset:
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = max(entry.version, args.opset)
    onnx.checker.check_model(model)
    onnx.save(model, args.out)
    print(f"{args.out}: {len(model.graph.node)} nodes, construct {args.construct}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
