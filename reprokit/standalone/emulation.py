"""fp16/bf16 storage emulation as a pure model rewrite: numpy, onnx and ml_dtypes only.

Kept free of reprokit imports on purpose: report archives embed this file verbatim in their
standalone ``repro.py``, so the repro computes exactly what reprokit computed. The one exception,
``reprokit.standalone.names`` (new names for the Casts), is embedded just above it there.
"""

from __future__ import annotations

import numpy as np

from reprokit.standalone.names import FreshNames  # repro.py: embedded above

NARROW = {"fp16": "float16", "bf16": "bfloat16"}


class CannotEmulate(ValueError):
    """The model cannot be rewritten for storage emulation (its opset cannot be lifted)."""


def round_through(array: np.ndarray, narrow: str) -> np.ndarray:
    """Round a float32 array through fp16/bf16 and back (numpy, no engine)."""
    if array.dtype != np.float32:
        return array
    if narrow == "fp16":
        with np.errstate(over="ignore"):
            return array.astype(np.float16).astype(np.float32)
    import ml_dtypes

    return array.astype(ml_dtypes.bfloat16).astype(np.float32)


def emulate_model(model, narrow: str, keep_fp32: frozenset[str] = frozenset()):
    """Return a copy of ``model`` whose float storage is rounded through ``narrow``.

    ``keep_fp32`` names nodes whose outputs stay fp32 (the "keep this layer in FP32" knob);
    weights that only such nodes read stay fp32 too. Tensor names are unchanged: each float
    output or weight ``t`` is produced as ``t`` by a Cast pair fed from a renamed wide copy.
    Weights are rounded by Casts in the graph, never loaded here, so a model whose weights are
    external data is rewritten without reading them.
    """
    import onnx
    from onnx import TensorProto

    model = onnx.ModelProto.FromString(model.SerializeToString())
    inferred = _inferred(model)
    if _holds_float(model, inferred):
        # Cast to bfloat16 exists from opset 13 on: lifted only when a rounding Cast is needed,
        # and a lift may change what the model computes (Scan-8 → Scan-9): the engine checks the
        # lifted copy on the reference before judging anything (lift_changes).
        model = _lift_opset(model, 13 if narrow == "bf16" else 1)
        inferred = _inferred(model)
    float_names = {
        vi.name
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    narrow_type = TensorProto.FLOAT16 if narrow == "fp16" else TensorProto.BFLOAT16
    # Outer-scope types for If/Loop/Scan bodies, which whole-model inference leaves untyped.
    outer = {vi.name: vi.type.tensor_type.elem_type
             for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
             if vi.type.HasField("tensor_type")}
    outer.update({init.name: init.data_type for init in model.graph.initializer})
    pool = FreshNames.of(model)
    initializers = {init.name for init in model.graph.initializer}
    float_inputs = [vi.name for vi in model.graph.input if vi.name not in initializers
                    and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == TensorProto.FLOAT]
    _round_graph(model, model.graph, float_names, outer, narrow_type, keep_fp32, "", [0], pool, float_inputs)
    return model


def _inferred(model):
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference is best effort; unknown types are left wide
        return model


def _holds_float(model, inferred) -> bool:
    """Does the model have a float tensor the emulation would round (so a Cast to the narrow type)?"""
    from onnx import TensorProto

    values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
    return (any(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in values if v.type.HasField("tensor_type"))
            or any(t.data_type == TensorProto.FLOAT for t in model.graph.initializer)
            or any(_subgraphs(n) for n in model.graph.node))  # bodies: their floats are typed late


def lift_changes(model, feeds: dict) -> str | None:
    """Why the opset lift of bf16 emulation cannot be trusted on this model and these feeds, or
    None: onnxruntime runs the lifted copy (no rounding) and the original, and they must agree.
    None too when nothing is lifted or when the original itself does not run here."""
    import onnxruntime as ort

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= 13 or not _holds_float(model, _inferred(model)):
        return None
    try:
        lifted = _lift_opset(type(model).FromString(model.SerializeToString()), 13)
    except CannotEmulate as exc:
        return str(exc)

    def run(proto):
        # as the reference runs (no graph optimizations), without the arena that would keep
        # the first run's buffers through the second
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.enable_cpu_mem_arena = False
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        return session.run(None, {k: v for k, v in feeds.items() if k in names})

    # The two runs' outputs are never held together (a packed call's outputs are hundreds of
    # MiB): the original's are kept as digests of their bytes; the lifted copy's outputs that
    # are not the same bytes are the only ones kept, and compared with the original run again.
    try:
        before = [_digest(value) for value in run(model)]
    except Exception:  # the original does not run here: the reference says so on its own
        return None
    try:
        after = run(lifted)
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
        return f"the copy lifted from opset {opset} to 13 does not run on the same feeds: {said}"
    same = len(before) == len(after)
    differ = {k: value for k, value in enumerate(after) if same and _digest(value) != before[k]}
    del after
    if same and differ:
        again = run(model)
        same = all(_same_values(again[k], value) for k, value in differ.items())
    return None if same else f"the copy lifted from opset {opset} to 13 computes other values than the original"


def _digest(value) -> tuple:
    """An output's shape, dtype and a digest of its bytes (a sequence: each tensor's): equal
    digests, equal values."""
    import hashlib

    if isinstance(value, (list, tuple)):
        return tuple(_digest(item) for item in value)
    array = np.ascontiguousarray(np.asarray(value))
    data = repr(array.tolist()).encode() if array.dtype.hasobject else array.reshape(-1).view(np.uint8)
    return array.shape, array.dtype.str, hashlib.blake2b(data, digest_size=16).digest()


def _same_values(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-6, atol=0, equal_nan=True))
    return bool(np.array_equal(a, b))


def _round_trip(model, source: str, out: str, mid: str, cast_name: str, narrow_type: int, pool,
                weight: bool = False) -> list:
    """Nodes computing ``out`` = ``source`` rounded through the narrow type (Cast to it, ``mid``,
    and back); a ``weight`` is clamped to the narrow range first (:func:`_clamp_weight`)."""
    from onnx import TensorProto, helper

    clamp = _clamp_weight(model, source, narrow_type, pool) if weight else []
    return clamp + [helper.make_node("Cast", [clamp[-1].output[0] if clamp else source], [mid], to=narrow_type,
                                     name=mid),
                    helper.make_node("Cast", [mid], [out], to=TensorProto.FLOAT, name=cast_name)]


def _clamp_weight(model, name: str, narrow_type: int, pool) -> list:
    """Nodes clamping weight ``name`` to the narrow type's finite range (fp16: ±65504) before its
    rounding: a weight past the range becomes the largest finite value, as reprokit's conversion
    (reprokit.convert.values) and TensorRT ("weights … outside of [-65504, 65504] … clamped") do;
    only computed values overflow to inf. bf16 covers float32's range: nothing to clamp."""
    from onnx import TensorProto, helper

    if narrow_type != TensorProto.FLOAT16:
        return []
    limit = 65504.0
    out = pool.fresh(f"{name}__rk_clamp")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 11:  # Clip-6: bounds as attributes
        return [helper.make_node("Clip", [name], [out], min=-limit, max=limit, name=out)]
    low, high = pool.fresh(f"{name}__rk_lo"), pool.fresh(f"{name}__rk_hi")
    return [helper.make_node("Constant", [], [low], value=helper.make_tensor(low, TensorProto.FLOAT, [], [-limit]),
                             name=low),
            helper.make_node("Constant", [], [high], value=helper.make_tensor(high, TensorProto.FLOAT, [], [limit]),
                             name=high),
            helper.make_node("Clip", [name, low, high], [out], name=out)]


def _lift_opset(model, minimum: int):
    """The model with a default-domain opset of at least ``minimum``, for the rounding Casts
    (Cast to bfloat16 exists from opset 13 on)."""
    from onnx import helper, version_converter

    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        # Only other domains (ai.onnx.ml, ...): no node is in the default domain, so importing
        # it changes nothing but makes the Casts legal; the version converter cannot do this.
        model.opset_import.append(helper.make_opsetid("", max(minimum, 13)))
        return model
    if opset.version >= minimum:
        return model
    try:
        lifted = version_converter.convert_version(model, minimum)
    except Exception as exc:  # onnx raises RuntimeError/ValueError from its C++ converter
        reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[-1]
        raise CannotEmulate(f"the ONNX version converter cannot lift opset {opset.version} to {minimum}: "
                            f"{reason}") from exc
    if not lifted.functions and model.functions:
        # The converter drops model-local functions; their bodies keep their own opset imports.
        lifted.functions.extend(model.functions)
    return lifted


def _subgraphs(node):
    for attr in node.attribute:
        if attr.type == attr.GRAPH:
            yield attr.g
        elif attr.type == attr.GRAPHS:
            yield from attr.graphs


# The slots of quantization parameters (scale, zero point) per op: TensorRT keeps Q/DQ scales in
# fp32 whatever the precision, so the emulator never rounds a tensor read only there.
_SCALE_SLOTS = {"QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2), "QLinearConv": (1, 2, 4, 5, 6, 7),
                "QLinearMatMul": (1, 2, 4, 5, 6, 7), "QLinearAdd": (1, 2, 4, 5, 6, 7),
                "QLinearMul": (1, 2, 4, 5, 6, 7), "QGemm": (1, 2, 4, 5, 7, 8)}


def _scale_only(graph) -> set[str]:
    """Tensors of ``graph`` read only as quantization parameters (scales, zero points)."""
    at_scale: set[str] = set()
    elsewhere: set[str] = set()
    for node in graph.node:
        slots = _SCALE_SLOTS.get(node.op_type, ())
        for slot, name in enumerate(node.input):
            (at_scale if slot in slots else elsewhere).add(name)
        for sub in _subgraphs(node):
            elsewhere.update(_reads(sub))
    return at_scale - elsewhere - {""}


def _reads(graph) -> dict[str, set[str]]:
    """Tensor name → names of the nodes that read it, a node with a body counting for its body."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
        for sub in _subgraphs(node):
            for name in _reads(sub):
                readers.setdefault(name, set()).add(node.name)
    return readers


def _body_types(model, graph, outer: dict[str, int]) -> dict[str, int]:
    """Element types inside an If/Loop/Scan body: shape inference on a data-free standalone copy
    whose outer-scope reads become typed inputs (types never depend on values)."""
    import onnx
    from onnx import helper

    standalone = onnx.GraphProto(name=graph.name or "body")
    standalone.node.extend(graph.node)
    standalone.input.extend(graph.input)
    standalone.output.extend(graph.output)
    standalone.value_info.extend(graph.value_info)
    declared = {vi.name for vi in graph.input} | {o for node in graph.node for o in node.output}
    for init in graph.initializer:
        if init.name not in declared:
            standalone.input.append(helper.make_tensor_value_info(init.name, init.data_type, None))
            declared.add(init.name)
    for name in sorted(set(_reads(graph)) - declared):
        if name in outer:
            standalone.input.append(helper.make_tensor_value_info(name, outer[name], None))
    probe = helper.make_model(standalone, opset_imports=model.opset_import)
    probe.ir_version = model.ir_version
    probe.functions.extend(model.functions)
    try:
        probe = onnx.shape_inference.infer_shapes(probe)
    except Exception:  # best effort, as for the top-level graph; declared types still count
        pass
    types = dict(outer)
    for vi in list(probe.graph.input) + list(probe.graph.output) + list(probe.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def _round_graph(model, graph, float_names, outer, narrow_type, keep_fp32, tag, counter, pool,
                 float_inputs=()) -> None:
    """Round ``graph``'s float initializers and node outputs, and every body nested in it: a
    body's values never leave it unrounded, so an overflow inside an If branch or a Loop shows.
    ``float_inputs`` (the model's float graph inputs) reach narrow readers rounded and nodes kept
    in fp32 as given, as the converted model's Casts and TensorRT's input reformat do."""
    from onnx import TensorProto

    readers = _reads(graph)
    scales = _scale_only(graph)
    graph_inputs = {vi.name: vi for vi in graph.input}
    new_nodes = []
    for init in graph.initializer:
        name = init.name
        if init.data_type != TensorProto.FLOAT or (readers.get(name) and readers[name] <= keep_fp32) or name in scales:
            continue
        wide, mid = pool.fresh(f"{name}__rk_wide{tag}"), pool.fresh(f"{name}__rk_narrow{tag}")
        init.name = wide
        if name in graph_inputs:  # old models list weights among the inputs too
            graph_inputs[name].name = wide
        new_nodes += _round_trip(model, wide, name, mid, pool.fresh(name + "__rk_cast"), narrow_type, pool, weight=True)
    narrow_reads: dict[str, str] = {}  # a kept node's fp32 output -> its rounded copy, for narrow readers
    for name in float_inputs:
        mid, read = pool.fresh(f"{name}__rk_narrow{tag}"), pool.fresh(f"{name}__rk_read{tag}")
        new_nodes += _round_trip(model, name, read, mid, read, narrow_type, pool)
        narrow_reads[name] = read
    originals = list(graph.node)
    for index, node in enumerate(originals):
        new_nodes.append(node)
        for sub in _subgraphs(node):
            counter[0] += 1
            types = _body_types(model, sub, outer)
            inner = {n for n, t in types.items() if t == TensorProto.FLOAT}
            _round_graph(model, sub, inner, types, narrow_type, keep_fp32, f"_b{counter[0]}_", counter, pool)
        if node.name in keep_fp32:
            # stays fp32 for kept readers and the graph's outputs; a narrow reader gets it rounded,
            # as the conversion's Cast in front of a narrow node and TensorRT's reformat do
            for name in node.output:
                if name and name in float_names:
                    mid, read = pool.fresh(f"{name}__rk_narrow{tag}{index}"), pool.fresh(f"{name}__rk_read{tag}")
                    new_nodes += _round_trip(model, name, read, mid, read, narrow_type, pool)
                    narrow_reads[name] = read
            continue
        for slot, name in enumerate(node.output):
            if not name or name not in float_names or name in scales:
                continue
            wide, mid = pool.fresh(f"{name}__rk_wide{tag}{index}"), pool.fresh(f"{name}__rk_narrow{tag}{index}")
            node.output[slot] = wide
            # a Constant's output is a weight: clamped, as the conversion and TensorRT do
            new_nodes += _round_trip(model, wide, name, mid, pool.fresh(name + "__rk_cast"), narrow_type, pool,
                                     weight=node.op_type == "Constant")
    for node in originals:
        if node.name not in keep_fp32:
            for slot, name in enumerate(node.input):
                if name in narrow_reads:
                    node.input[slot] = narrow_reads[name]
    del graph.node[:]
    graph.node.extend(new_nodes)


def clamped_constants(model, narrow: str) -> list[tuple[str, float]]:
    """The initializers and Constant outputs of ``model`` holding ±inf, which the emulator clamps
    to ±65504 (fp16): a finding on a model that holds one depends on that emulation choice.
    A finite weight past the range is clamped as TensorRT documents it clamps weights; whether it
    turns a ``-inf`` constant (an attention mask) into -65504 or keeps the inf, which fp16 holds,
    depends on how it folds it."""
    from onnx import numpy_helper

    if narrow != "fp16":
        return []
    found = []
    tensors = [(t.name, t) for t in model.graph.initializer]
    tensors += [(n.output[0], a.t) for n in model.graph.node if n.op_type == "Constant" and n.output
                for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        if tensor.data_location == tensor.EXTERNAL:  # weights not loaded: a big table, not a mask constant
            continue
        value = numpy_helper.to_array(tensor)
        if value.dtype.kind == "f" and value.size and np.isinf(value).any():
            found.append((name, float("inf")))
    return found
