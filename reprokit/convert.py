"""float32 → fp16/bf16 ONNX conversion: the model a strongly typed engine needs to compute narrow.

Strongly typed TensorRT (≥ 11, TensorRT-RTX, or ``strongly-typed``) has no FP16/BF16 builder
flags: it computes in the types the ONNX file states. This module rewrites a copy of a model so
its float arithmetic is narrow, while what a caller feeds and reads stays float32:

- float32 initializers, Constant values and type-picking attributes (Cast ``to``,
  ConstantOfShape ``value``, Random* / EyeLike / Bernoulli ``dtype``) become narrow; finite
  values past the narrow range are clamped to its maximum, as TensorRT does with weights;
- float graph inputs/outputs keep float32, with a Cast right after each input and right before
  each output (the producer's tensor is renamed ``NAME__rk_fp16``; the output keeps ``NAME``);
- nodes named in ``keep_fp32`` compute in float32 between Casts, reading exact float32 copies
  of their weights;
- an op input or output whose ONNX schema, at the model's opset, does not accept the narrow type
  (Resize ``scales``, QuantizeLinear/DequantizeLinear scales before opset 19, most ops in bf16
  before opset 22...) keeps float32: a Cast bridges it, or the whole node stays float32 when its
  output cannot be narrow (such nodes are listed in the report).

Opset, ir_version, node names and the names of all other tensors are kept. The model must have
its external data loaded. Must not run an engine, and must not touch non-float tensors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reprokit.names import FreshNames

_NARROW = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_TYPE_STR = {TensorProto.FLOAT16: "tensor(float16)", TensorProto.BFLOAT16: "tensor(bfloat16)"}
_FLOAT = TensorProto.FLOAT
WIDE, NARROW = "fp32", "narrow"

# Ops whose float output type is picked by an attribute: (attribute, its default output type).
_TYPE_ATTR = {
    "Cast": ("to", None),
    "ConstantOfShape": ("value", _FLOAT),
    "RandomNormal": ("dtype", _FLOAT),
    "RandomUniform": ("dtype", _FLOAT),
    "RandomNormalLike": ("dtype", None),
    "RandomUniformLike": ("dtype", None),
    "EyeLike": ("dtype", None),
    "Bernoulli": ("dtype", None),
}
# Inputs that are read whatever their float type: a Cast in front would only lose precision.
_ANY_INPUT = {"Cast": {0}, "CastLike": {0}, "Shape": {0}, "Size": {0}}


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`convert_float_model_report` did besides the plain type change."""

    to: str
    kept_fp32: tuple[str, ...]  # nodes kept in float32 because the caller asked
    schema_fp32: tuple[str, ...]  # kept in float32: their schema refuses narrow, or local function
    casts: int  # Cast nodes inserted


def convert_float_model(
    model: onnx.ModelProto, to: str, keep_fp32: set[str] | frozenset[str] = frozenset()
) -> onnx.ModelProto:
    """Return a copy of ``model`` computing in ``to`` ("fp16" or "bf16"), float32 I/O kept."""
    return convert_float_model_report(model, to, keep_fp32)[0]


def convert_float_model_report(
    model: onnx.ModelProto, to: str, keep_fp32: set[str] | frozenset[str] = frozenset()
) -> tuple[onnx.ModelProto, ConversionReport]:
    """Like :func:`convert_float_model`, with a report; ValueError on an unknown node name."""
    if to not in _NARROW:
        raise ValueError(f"cannot convert to {to!r}: choose one of {', '.join(_NARROW)}")
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    keep_fp32 = frozenset(n for n in keep_fp32 if n)  # "" would match every unnamed node
    missing = sorted(keep_fp32 - set(node_names(converted.graph)))
    if missing:
        raise ValueError(f"no node named {', '.join(map(repr, missing))} in the model")
    converter = _Converter(converted, _NARROW[to], keep_fp32)
    converter.convert_graph(converted.graph, io_wide=True)
    report = ConversionReport(
        to=to,
        kept_fp32=tuple(sorted(keep_fp32)),
        schema_fp32=tuple(converter.schema_fp32),
        casts=converter.casts,
    )
    return converted, report


def _subgraphs(node):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def node_names(graph):
    """Names of the nodes of ``graph`` and of its subgraphs."""
    for node in graph.node:
        yield node.name
        for sub in _subgraphs(node):
            yield from node_names(sub)


def _defined(graph) -> set[str]:
    names = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    return names | {o for node in graph.node for o in node.output if o}


def _outer_refs(graph) -> set[str]:
    """Names a (sub)graph reads from enclosing scopes."""
    used = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for sub in _subgraphs(node):
            used |= _outer_refs(sub)
    used.update(o.name for o in graph.output)
    return used - _defined(graph)


def _rename_refs(graph, old: str, new: str) -> None:
    """Point every read of outer ``old`` in subgraph ``graph`` (and nested scopes) at ``new``."""
    for out in graph.output:
        if out.name == old:
            out.name = new
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for sub in _subgraphs(node):
            if old not in _defined(sub):
                _rename_refs(sub, old, new)


def _narrow_tensor(array: np.ndarray, name: str, narrow: int) -> TensorProto:
    """A narrow TensorProto of float32 ``array``; finite values past the range are clamped."""
    array = np.asarray(array, dtype=np.float32)
    if narrow == TensorProto.FLOAT16:
        limit = float(np.finfo(np.float16).max)
        clamped = np.where(np.isfinite(array), np.clip(array, -limit, limit), array)
        return numpy_helper.from_array(clamped.astype(np.float16), name)
    import ml_dtypes

    limit = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    clamped = np.where(np.isfinite(array), np.clip(array, -limit, limit), array)
    bits = clamped.astype(ml_dtypes.bfloat16).view(np.uint16)
    return helper.make_tensor(name, narrow, array.shape, bits.tobytes(), raw=True)


def _constant_value(node) -> np.ndarray | None:
    """The float32 value of a Constant node, or None when it is not float32."""
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type == _FLOAT:
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(attr.floats, dtype=np.float32)
    return None


class _Scope:
    """One graph being rewritten: its facts, and where new nodes go."""

    def __init__(self, graph, io: str):
        self.graph = graph
        self.io = io  # precision of the scope's float inputs and outputs
        declared = {vi.name for vi in graph.input}
        self.inits = {t.name: t for t in graph.initializer if t.name not in declared}
        self.producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
        self.outputs: list[str] = []  # float outputs, set by the converter
        self.needs: dict[str, set[str]] = defaultdict(set)  # tensor → precisions its readers want
        self.made: dict[tuple[str, str], str] = {}  # (tensor, precision) → its copy
        self._front: list = []  # copies of inputs and outer names, placed first
        self._after: dict[int, list] = defaultdict(list)  # producer index → nodes after it

    def place(self, name: str, node) -> None:
        """Put ``node`` (which reads ``name``) right after ``name``'s producer."""
        if name in self.producer:
            self._after[self.producer[name]].append(node)
        else:
            self._front.append(node)

    def rebuild(self) -> None:
        nodes = list(self._front)
        for index, node in enumerate(self.graph.node):
            nodes.append(node)
            nodes.extend(self._after.get(index, ()))
        del self.graph.node[:]
        self.graph.node.extend(nodes)


class _Converter:
    def __init__(self, model: onnx.ModelProto, narrow: int, keep: frozenset[str]):
        self.model = model
        self.narrow = narrow
        self.label = "fp16" if narrow == TensorProto.FLOAT16 else "bf16"
        self.keep = keep
        self.opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
        self.functions = {(f.domain, f.name) for f in model.functions}
        self.types: dict[str, int] = {}
        self.domain: dict[str, str] = {}  # float tensor → WIDE or NARROW, after conversion
        self.used = FreshNames(node_names(model.graph))
        self.schema_fp32: list[str] = []
        self.casts = 0
        self._collect_types(model.graph)

    # -- facts about the original model -------------------------------------------------------

    def _collect_types(self, graph) -> None:
        """Element types of every tensor in ``graph`` and its subgraphs, from shape inference.

        Initializers become typed inputs of a data-free copy: types never depend on values, and
        the copy stays small (and under protobuf's 2 GB) for any model.
        """
        standalone = onnx.GraphProto(name=graph.name or "g")
        standalone.node.extend(graph.node)
        standalone.input.extend(graph.input)
        standalone.output.extend(graph.output)
        standalone.value_info.extend(graph.value_info)
        declared = {vi.name for vi in graph.input}
        for init in graph.initializer:
            if init.name not in declared:
                standalone.input.append(
                    helper.make_tensor_value_info(init.name, init.data_type, None)
                )
        for name in sorted(_outer_refs(graph) - declared):
            if name in self.types:
                standalone.input.append(helper.make_tensor_value_info(name, self.types[name], None))
        probe = helper.make_model(standalone, opset_imports=self.model.opset_import)
        probe.ir_version = self.model.ir_version
        probe.functions.extend(self.model.functions)
        try:
            probe = onnx.shape_inference.infer_shapes(probe)
        except Exception:  # inference is best effort; declared types still count
            pass
        for vi in list(probe.graph.input) + list(probe.graph.output) + list(probe.graph.value_info):
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
        for node in graph.node:
            self.used.take(node.output)
            if node.op_type == "Constant" and _constant_value(node) is not None:
                self.types[node.output[0]] = _FLOAT
            for sub in _subgraphs(node):
                self._collect_types(sub)
        self.used.take(self.types)

    def _is_float(self, name: str) -> bool:
        return bool(name) and self.types.get(name) == _FLOAT

    def _allows_narrow(self, schema, params, index: int) -> bool:
        if not params:
            return True
        param = params[min(index, len(params) - 1)]
        allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
        return _TYPE_STR[self.narrow] in allowed.get(param.type_str, [param.type_str])

    def _requirements(self, node) -> tuple[bool, set[int]]:
        """(node computes in float32 as a whole, indices of inputs that must stay float32)."""
        if node.name in self.keep:
            if any(True for _ in _subgraphs(node)):
                raise ValueError(f"cannot keep {node.name!r} in fp32: it has subgraphs")
            return True, set()
        if (node.domain, node.op_type) in self.functions:  # its body is typed float32 inside
            self.schema_fp32.append(node.name or node.op_type)
            return True, set()
        try:
            schema = onnx.defs.get_schema(
                node.op_type, self.opsets.get(node.domain or "ai.onnx", 1), node.domain
            )
        except Exception:  # custom domains: assume the op follows its inputs' type
            return False, set()
        for index, name in enumerate(node.output):
            if self._is_float(name) and not self._allows_narrow(schema, schema.outputs, index):
                self.schema_fp32.append(node.name or f"{node.op_type}->{name}")
                return True, set()
        return False, {
            index
            for index, name in enumerate(node.input)
            if self._is_float(name) and not self._allows_narrow(schema, schema.inputs, index)
        }

    def _picks_type(self, node) -> bool:
        """Does an attribute make this node's output float32 (so it can be retargeted)?"""
        if node.op_type == "Constant":
            return _constant_value(node) is not None
        spec = _TYPE_ATTR.get(node.op_type)
        if spec is None or not node.output or not self._is_float(node.output[0]):
            return False
        attr_name, default = spec
        for attr in node.attribute:
            if attr.name == attr_name:
                return attr.t.data_type == _FLOAT if attr_name == "value" else attr.i == _FLOAT
        return default == _FLOAT

    # -- the rewrite ---------------------------------------------------------------------------

    def convert_graph(self, graph, io_wide: bool) -> None:
        """Convert one scope; ``io_wide``: its inputs/outputs stay float32 (the main graph)."""
        scope = _Scope(graph, WIDE if io_wide else NARROW)
        scope.outputs = [o.name for o in graph.output if self._is_float(o.name)]
        plans = [self._plan(scope, node) for node in graph.node]
        for name in scope.outputs:
            scope.needs[name].add(scope.io)
        self._assign(scope, plans)
        renames = self._keep_output_names(scope)
        for node, (_, wants, implicit) in zip(graph.node, plans, strict=True):
            for index, want in enumerate(wants):
                name = node.input[index]
                if want and self.domain.get(name, want) != want:
                    node.input[index] = self._converted(scope, name, want)
            for name in (renames.get(n, n) for n in implicit):
                if self.domain.get(name, NARROW) != NARROW:
                    new = self._converted(scope, name, NARROW)
                    for sub in _subgraphs(node):
                        _rename_refs(sub, name, new)
        self._retype(scope, io_wide)
        scope.rebuild()
        for node in graph.node:
            for sub in _subgraphs(node):
                self.convert_graph(sub, io_wide=False)

    def _plan(self, scope: _Scope, node):
        """(whole node in float32, per-input precision wanted, float names read by subgraphs)."""
        whole, wide_inputs = self._requirements(node)
        wants = []
        for index, name in enumerate(node.input):
            if not self._is_float(name):
                wants.append(None)
            elif whole or index in wide_inputs:
                wants.append(WIDE)
            elif index in _ANY_INPUT.get(node.op_type, ()):
                wants.append(None)
            else:
                wants.append(NARROW)
            if wants[-1]:
                scope.needs[name].add(wants[-1])
        implicit = {n for sub in _subgraphs(node) for n in _outer_refs(sub) if self._is_float(n)}
        for name in implicit:
            scope.needs[name].add(NARROW)
        return whole, wants, sorted(implicit)

    def _assign(self, scope: _Scope, plans) -> None:
        """Pick each float tensor's precision; values and type-picking nodes follow readers."""

        def follow_readers(name):  # narrow unless every reader needs float32
            return WIDE if scope.needs.get(name) == {WIDE} else NARROW

        for vi in scope.graph.input:
            if self._is_float(vi.name):
                self.domain[vi.name] = scope.io
        for name in scope.inits:
            if self._is_float(name):
                self.domain[name] = scope.io if name in scope.outputs else follow_readers(name)
        for node, (whole, _, _) in zip(scope.graph.node, plans, strict=True):
            picks = not whole and self._picks_type(node)
            for name in node.output:
                if self._is_float(name):
                    narrow = follow_readers(name) if picks else NARROW
                    self.domain[name] = WIDE if whole else narrow

    def _keep_output_names(self, scope: _Scope) -> dict[str, str]:
        """A float output keeps its name via a Cast; a producer of the other precision is renamed."""
        renames = {}
        for name in scope.outputs:
            if self.domain[name] == scope.io or name not in scope.producer:
                continue
            renamed = self._fresh(f"{name}__rk_{self._label(self.domain[name])}")
            node = scope.graph.node[scope.producer[name]]
            node.output[list(node.output).index(name)] = renamed
            for other in scope.graph.node:
                for index, value in enumerate(other.input):
                    if value == name:
                        other.input[index] = renamed
                for sub in _subgraphs(other):
                    if name not in _defined(sub):
                        _rename_refs(sub, name, renamed)
            self.types[renamed], self.domain[renamed] = _FLOAT, self.domain[name]
            scope.producer[renamed] = scope.producer.pop(name)
            scope.place(renamed, self._cast(renamed, name, scope.io))
            self.domain[name] = scope.io
            scope.made[(renamed, scope.io)] = name  # readers of that precision read the output
            renames[name] = renamed
        return renames

    def _label(self, want: str) -> str:
        return "fp32" if want == WIDE else self.label

    def _fresh(self, base: str) -> str:
        return self.used.fresh(base)

    def _cast(self, source: str, target: str, want: str):
        self.casts += 1
        to = _FLOAT if want == WIDE else self.narrow
        return helper.make_node(
            "Cast", [source], [target], to=to, name=self._fresh(f"{target}__rk_cast")
        )

    def _converted(self, scope: _Scope, name: str, want: str) -> str:
        """``name`` in precision ``want``: an exact copy of a constant value, else a Cast, once."""
        if (name, want) in scope.made:
            return scope.made[(name, want)]
        target = self._fresh(f"{name}__rk_{self._label(want)}")

        def value_as(array, tensor_name):
            if want == NARROW:
                return _narrow_tensor(array, tensor_name, self.narrow)
            return numpy_helper.from_array(array, tensor_name)

        constant = scope.producer.get(name)
        if name in scope.inits:  # from the float32 original, not a Cast of a rounded value
            scope.graph.initializer.append(
                value_as(numpy_helper.to_array(scope.inits[name]), target)
            )
        elif constant is not None and scope.graph.node[constant].op_type == "Constant":
            value = value_as(_constant_value(scope.graph.node[constant]), "value")
            scope.place(
                name,
                helper.make_node("Constant", [], [target], value=value, name=self._fresh(target)),
            )
        else:
            scope.place(name, self._cast(name, target, want))
        self.types[target], self.domain[target] = _FLOAT, want
        scope.made[(name, want)] = target
        return target

    def _retype(self, scope: _Scope, io_wide: bool) -> None:
        """Make values, attributes and declared types narrow where the domain says so."""
        for name, init in scope.inits.items():
            if self._is_float(name) and self.domain.get(name) == NARROW:
                init.CopyFrom(_narrow_tensor(numpy_helper.to_array(init), name, self.narrow))
        for node in scope.graph.node:
            narrow = node.output and self.domain.get(node.output[0]) == NARROW
            if narrow and self._picks_type(node):
                self._retarget(node)
        declared = list(scope.graph.value_info)
        if not io_wide:
            declared += list(scope.graph.input) + list(scope.graph.output)
        for vi in declared:
            tensor_type = vi.type.tensor_type
            if tensor_type.elem_type == _FLOAT and self.domain.get(vi.name) == NARROW:
                tensor_type.elem_type = self.narrow

    def _retarget(self, node) -> None:
        """Point a type-picking node (Constant, Cast, ConstantOfShape, Random*...) at narrow."""
        if node.op_type == "Constant":
            value = _constant_value(node)
            del node.attribute[:]
            node.attribute.append(
                helper.make_attribute("value", _narrow_tensor(value, "value", self.narrow))
            )
            return
        attr_name, _ = _TYPE_ATTR[node.op_type]
        kept = [a for a in node.attribute if a.name != attr_name]
        if attr_name == "value":
            old = next((a.t for a in node.attribute if a.name == "value"), None)
            value = numpy_helper.to_array(old) if old is not None else np.zeros(1, np.float32)
            new = helper.make_attribute("value", _narrow_tensor(value, "value", self.narrow))
        else:
            new = helper.make_attribute(attr_name, self.narrow)
        del node.attribute[:]
        node.attribute.extend([*kept, new])
