"""onnx-graphsurgeon's constant folding as polygraphy's ``surgeon sanitize`` runs it (passes until
nothing more folds), and onnx's shape inference on a view of a model without its weights' bytes:
what :func:`reprokit.engine.folding.fold_constants` uses where onnxruntime's pure fold
(:mod:`reprokit.engine.ortfold`) does not serve. Runs onnxruntime in this process (through
onnx-graphsurgeon); checks nothing — :mod:`reprokit.engine.folding` checks what it folds.
"""

from __future__ import annotations

from reprokit.graph.index import has_bodies


def gs_passes(onnx, folded):
    """onnx-graphsurgeon's folding as polygraphy's sanitize runs it: shapes inferred before
    each pass (gs folds a Shape only where it knows the shape), passes until nothing more folds
    — each pass's folded shapes let the next fold what read them. None when gs fails."""
    import onnx_graphsurgeon as gs

    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # gs folds with onnxruntime in this process
    except Exception:
        pass
    try:
        for _ in range(FOLD_PASSES):
            before = len(folded.graph.node)
            folded = _fold_pass(onnx, gs, folded)
            if len(folded.graph.node) >= before:
                break
    except Exception:
        return None
    return folded


FOLD_PASSES = 8


def _fold_pass(onnx, gs, model):
    try:
        model = infer_shapes(onnx, model)
    except Exception:
        pass  # gs folds what it can without the shapes
    folded = _gs_fold(gs, model, flatten=True)
    # gs's flattening of nested If nodes with constant conditions can drop a branch output
    # (silero-vad: "'/model/decoder/If_1_output_1' is not ... output of a previous node");
    # folding without flattening still folds the shape arithmetic. Only a model with bodies is
    # checked: onnx's checker serializes the whole model, weights and all, on every pass
    if any(has_bodies(node) for node in model.graph.node) and not _well_formed(onnx, folded):
        folded = _gs_fold(gs, model, flatten=False)
    return folded


_FLOATS = frozenset({1, 10, 11, 16})  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def infer_shapes(onnx, model):
    """onnx's shape inference, run on a view of ``model`` whose float weights of 1 KiB or more
    have no bytes (marked external): it reads their dims and type, and the data only of shape
    inputs (small integer tensors, kept). onnx hands the whole model to C++ and back as bytes,
    weights and all; a Swin's 110 MB made that a second per pass. The inferred value infos are
    set on ``model`` itself (the fold's own copy). A model with bodies is inferred as it is."""
    if any(has_bodies(node) for node in model.graph.node):
        return onnx.shape_inference.infer_shapes(model)
    view = onnx.ModelProto()
    view.CopyFrom(model)
    for init in view.graph.initializer:
        if init.data_type in _FLOATS and init.HasField("raw_data") and len(init.raw_data) >= 1024:
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            entry = init.external_data.add()
            entry.key, entry.value = (
                "location",
                "reprokit-shape-view",
            )  # never read: nothing loads it
    inferred = onnx.shape_inference.infer_shapes(view)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def _gs_fold(gs, model, *, flatten: bool):
    graph = gs.import_onnx(model)
    graph.fold_constants(error_ok=True, flatten_subgraphs=flatten).cleanup().toposort()
    return gs.export_onnx(graph, do_type_check=False)


def _well_formed(onnx, model) -> bool:
    """Does every node read a tensor something defines (onnx's checker, no shape inference)?"""
    try:
        onnx.checker.check_model(model)
    except Exception:
        return False
    return True
