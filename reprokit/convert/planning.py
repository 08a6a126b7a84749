"""Type planning for the conversion: the element type of every tensor (shape inference on a
data-free copy), which nodes must compute in float32 (the caller's ``keep_fp32``, local
functions, op schemas that refuse the narrow type at the model's opset), what precision each
reader wants, and the precision each float tensor gets.

Must not edit the graph: :mod:`reprokit.convert.casts` writes what the plan decides.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from reprokit.convert.scopes import Scope
from reprokit.convert.values import (
    ANY_INPUT,
    FLOAT,
    NARROW,
    TYPE_ATTR,
    TYPE_STR,
    WIDE,
    constant_value,
)
from reprokit.graph.index import bodies, has_bodies, outer_refs
from reprokit.standalone.names import FreshNames


class TypePlan:
    """Facts about the original model and the precision chosen for each float tensor."""

    def __init__(self, model: onnx.ModelProto, narrow: int, keep: frozenset[str], used: FreshNames):
        self.model = model
        self.narrow = narrow
        self.label = "fp16" if narrow == TensorProto.FLOAT16 else "bf16"
        self.keep = keep
        self.opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
        self.functions = {(f.domain, f.name) for f in model.functions}
        self.types: dict[str, int] = {}
        self.domain: dict[str, str] = {}  # float tensor → WIDE or NARROW, after conversion
        self.used = used
        self.schema_fp32: list[str] = []
        self.collect_types(model.graph)

    # -- facts about the original model -------------------------------------------------------

    def collect_types(self, graph) -> None:
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
        for name in sorted(outer_refs(graph) - declared):
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
            if node.op_type == "Constant" and constant_value(node) is not None:
                self.types[node.output[0]] = FLOAT
            for sub in bodies(node):
                self.collect_types(sub)
        self.used.take(self.types)

    def is_float(self, name: str) -> bool:
        return bool(name) and self.types.get(name) == FLOAT

    def _allows_narrow(self, schema, params, index: int) -> bool:
        if not params:
            return True
        param = params[min(index, len(params) - 1)]
        allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
        return TYPE_STR[self.narrow] in allowed.get(param.type_str, [param.type_str])

    def _requirements(self, node) -> tuple[bool, set[int]]:
        """(node computes in float32 as a whole, indices of inputs that must stay float32)."""
        if node.name in self.keep:
            if has_bodies(node):
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
            if self.is_float(name) and not self._allows_narrow(schema, schema.outputs, index):
                self.schema_fp32.append(node.name or f"{node.op_type}->{name}")
                return True, set()
        return False, {
            index
            for index, name in enumerate(node.input)
            if self.is_float(name) and not self._allows_narrow(schema, schema.inputs, index)
        }

    def picks_type(self, node) -> bool:
        """Does an attribute make this node's output float32 (so it can be retargeted)?"""
        if node.op_type == "Constant":
            return constant_value(node) is not None
        spec = TYPE_ATTR.get(node.op_type)
        if spec is None or not node.output or not self.is_float(node.output[0]):
            return False
        attr_name, default = spec
        for attr in node.attribute:
            if attr.name == attr_name:
                return attr.t.data_type == FLOAT if attr_name == "value" else attr.i == FLOAT
        return default == FLOAT

    # -- the plan for one scope ----------------------------------------------------------------

    def plan(self, scope: Scope, node):
        """(whole node in float32, per-input precision wanted, float names read by subgraphs)."""
        whole, wide_inputs = self._requirements(node)
        wants = []
        for index, name in enumerate(node.input):
            if not self.is_float(name):
                wants.append(None)
            elif whole or index in wide_inputs:
                wants.append(WIDE)
            elif index in ANY_INPUT.get(node.op_type, ()):
                wants.append(None)
            else:
                wants.append(NARROW)
            if wants[-1]:
                scope.needs[name].add(wants[-1])
        implicit = {n for sub in bodies(node) for n in outer_refs(sub) if self.is_float(n)}
        for name in implicit:
            scope.needs[name].add(NARROW)
        return whole, wants, sorted(implicit)

    def assign(self, scope: Scope, plans) -> None:
        """Pick each float tensor's precision; values and type-picking nodes follow readers."""

        def follow_readers(name):  # narrow unless every reader needs float32
            return WIDE if scope.needs.get(name) == {WIDE} else NARROW

        for vi in scope.graph.input:
            if self.is_float(vi.name):
                self.domain[vi.name] = scope.io
        for name in scope.inits:
            if self.is_float(name):
                self.domain[name] = scope.io if name in scope.outputs else follow_readers(name)
        for node, (whole, _, _) in zip(scope.graph.node, plans, strict=True):
            picks = not whole and self.picks_type(node)
            for name in node.output:
                if self.is_float(name):
                    narrow = follow_readers(name) if picks else NARROW
                    self.domain[name] = WIDE if whole else narrow
