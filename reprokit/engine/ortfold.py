"""onnxruntime's own constant folding as a pure fold: one session with every other rewrite of
its basic level disabled writes the folded graph, and the result is used only when it is the
user's graph with nodes folded away (:func:`pure_fold`), rebuilt from the user's own node protos.
:mod:`reprokit.engine.folding` tries it first and checks what it keeps on the reference. Runs
onnxruntime in this process; judges nothing.
"""

from __future__ import annotations

import os

# onnxruntime's basic-level rewrites other than ConstantFolding (its rule and transformer
# names): each would change what the engine is asked to build (MatMul+Add into Gemm, Conv+BN,
# Identity removed) or rename tensors (ConstantSharing). A name missing here from a later
# onnxruntime shows as a node that is not the user's, and :func:`pure_fold` sends that model
# to onnx-graphsurgeon instead.
_ORT_NOT_FOLDING = (
    "CommonSubexpressionElimination",
    "ConstantSharing",
    "MatMulAddFusion",
    "ReshapeFusion",
    "FreeDimensionOverrideTransformer",
    "QDQPropagationTransformer",
    "WeightBiasQuantization",
    "EnsureUniqueDQForNodeUnit",
    "DoubleQDQPairsRemover",
    "RemoveDuplicateCastTransformer",
    "CastFloat16Transformer",
    "QDQS8ToU8Transformer",
    "QDQFinalCleanupTransformer",
    "ShapeInputMerge",
    "GatherToSplitFusion",
    "GatherToSliceFusion",
    "ConcatSliceElimination",
    "MatMulBNFusion",
    "PadFusion",
    "SliceElimination",
    "Conv1dReplacement",
    "TransposeOptimizer",
    "DQMatMulNBitsFusion",
    "EliminateIdentity",
    "EliminateSlice",
    "UnsqueezeElimination",
    "EliminateDropout",
    "ExpandElimination",
    "CastElimination",
    "CastChainElimination",
    "PreShapeNodeElimination",
    "NoopElimination",
    "DivMulFusion",
    "FuseReluClip",
    "GemmSumFusion",
    "GemmTransposeFusion",
    "NotWhereFusion",
    "ConvAddFusion",
    "ConvMulFusion",
    "ConvBNFusion",
    "ClipQuantFusion",
    "ReluQuantFusion",
    "LabelEncoderFusion",
    "Level1_RuleBasedTransformer",
)


def ort_fold(onnx, model, source_path: str | None = None):
    """``model`` (its nodes named) folded by onnxruntime's ConstantFolding, which folds what its
    own shape inference pins in one session (a Swin export: 3,647 → 665 nodes, where
    onnx-graphsurgeon needed five import/fold/export passes); None when onnxruntime cannot or
    its result is not a pure fold (:func:`pure_fold`). The nodes kept are the user's own protos
    (onnxruntime writes attributes with their defaults filled in), the values of what folded
    are onnxruntime's; ``model`` (a private copy) becomes the folded model. ``source_path``: a
    file holding ``model`` as it is, which onnxruntime reads itself."""
    import tempfile

    try:
        import onnxruntime as ort

        with tempfile.TemporaryDirectory(prefix="reprokit-fold-") as tmp:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
            options.log_severity_level = 3
            ort.InferenceSession(
                source_path or model.SerializeToString(),
                options,
                providers=["CPUExecutionProvider"],
                disabled_optimizers=list(_ORT_NOT_FOLDING),
            )
            written = onnx.load(options.optimized_model_filepath)
    except Exception:
        return None
    if not pure_fold(model, written):
        return None
    kept = {tuple(n.output) for n in written.graph.node}  # outputs: unique, where names may repeat
    nodes = []  # the user's node protos, copied (no weights in them) before the graph is emptied
    for node in model.graph.node:
        if tuple(node.output) in kept:
            nodes.append(onnx.NodeProto())
            nodes[-1].CopyFrom(node)
    graph = model.graph  # rebuilt in place: its metadata, inputs and outputs are the user's
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(nodes)
    read = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
    graph.initializer.extend(t for t in written.graph.initializer if t.name in read)
    return model


def pure_fold(before, after) -> bool:
    """Is ``after`` ``before`` with some nodes folded away, and nothing else? Every node of
    ``after`` is one of ``before``'s (name, op, domain, the attributes ``before`` sets: a
    writer may add defaults), reading and writing the same tensor names; what the removed
    nodes computed is an initializer now; the graph's inputs and outputs are the same names.
    Cheap (no engine): a rewrite that fused, merged or renamed anything fails it."""
    if [i.name for i in after.graph.input] != [i.name for i in before.graph.input] or [
        o.name for o in after.graph.output
    ] != [o.name for o in before.graph.output]:
        return False
    by_outputs = {tuple(n.output): n for n in before.graph.node}  # unique, where names may repeat
    available = (
        {i.name for i in after.graph.input} | {t.name for t in after.graph.initializer} | {""}
    )
    seen: set[tuple] = set()
    for node in after.graph.node:
        mine = by_outputs.get(tuple(node.output))
        if (
            mine is None
            or tuple(node.output) in seen
            or mine.name != node.name
            or mine.op_type != node.op_type
            or mine.domain != node.domain
            or list(mine.input) != list(node.input)
            or list(mine.output) != list(node.output)
        ):
            return False
        theirs = {a.name: a.SerializeToString(deterministic=True) for a in node.attribute}
        if any(
            theirs.get(a.name) != a.SerializeToString(deterministic=True) for a in mine.attribute
        ):
            return False
        seen.add(tuple(node.output))
        available.update(node.output)
    # every tensor read is defined: a folded producer's output became an initializer of its name
    return all(name in available for node in after.graph.node for name in node.input) and all(
        o.name in available for o in after.graph.output
    )
