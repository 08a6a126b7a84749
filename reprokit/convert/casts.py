"""Cast insertion for the conversion: writes what the :class:`TypePlan` decided — Casts (or
exact narrow/float32 copies of constant values) where a reader wants the other precision,
graph outputs that keep their names behind a Cast, narrow initializers, retargeted
type-picking nodes (Constant, Cast, ConstantOfShape, Random*) and declared types.

Must not choose precisions: the plan does.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from reprokit.convert.planning import TypePlan
from reprokit.convert.scopes import Scope
from reprokit.convert.values import FLOAT, NARROW, TYPE_ATTR, WIDE, constant_value, narrow_tensor
from reprokit.graph.index import rename_reads


class CastWriter:
    """Graph edits for one conversion; counts the Casts it inserts."""

    def __init__(self, plan: TypePlan):
        self.plan = plan
        self.casts = 0

    def _label(self, want: str) -> str:
        return "fp32" if want == WIDE else self.plan.label

    def _fresh(self, base: str) -> str:
        return self.plan.used.fresh(base)

    def cast(self, source: str, target: str, want: str):
        self.casts += 1
        to = FLOAT if want == WIDE else self.plan.narrow
        return helper.make_node(
            "Cast", [source], [target], to=to, name=self._fresh(f"{target}__rk_cast")
        )

    def keep_output_names(self, scope: Scope) -> dict[str, str]:
        """A float output keeps its name via a Cast; a producer of the other precision is renamed."""
        plan = self.plan
        renames = {}
        for name in scope.outputs:
            if plan.domain[name] == scope.io or name not in scope.producer:
                continue
            renamed = self._fresh(f"{name}__rk_{self._label(plan.domain[name])}")
            node = scope.graph.node[scope.producer[name]]
            node.output[list(node.output).index(name)] = renamed
            rename_reads(scope.graph, {name: renamed})
            plan.types[renamed], plan.domain[renamed] = FLOAT, plan.domain[name]
            scope.producer[renamed] = scope.producer.pop(name)
            scope.place(renamed, self.cast(renamed, name, scope.io))
            plan.domain[name] = scope.io
            scope.made[(renamed, scope.io)] = name  # readers of that precision read the output
            renames[name] = renamed
        return renames

    def converted(self, scope: Scope, name: str, want: str) -> str:
        """``name`` in precision ``want``: an exact copy of a constant value, else a Cast, once."""
        if (name, want) in scope.made:
            return scope.made[(name, want)]
        plan = self.plan
        target = self._fresh(f"{name}__rk_{self._label(want)}")

        def value_as(array, tensor_name):
            if want == NARROW:
                return narrow_tensor(array, tensor_name, plan.narrow)
            return numpy_helper.from_array(array, tensor_name)

        constant = scope.producer.get(name)
        if name in scope.inits:  # from the float32 original, not a Cast of a rounded value
            scope.graph.initializer.append(
                value_as(numpy_helper.to_array(scope.inits[name]), target)
            )
        elif constant is not None and scope.graph.node[constant].op_type == "Constant":
            value = value_as(constant_value(scope.graph.node[constant]), "value")
            scope.place(
                name,
                helper.make_node("Constant", [], [target], value=value, name=self._fresh(target)),
            )
        else:
            scope.place(name, self.cast(name, target, want))
        plan.types[target], plan.domain[target] = FLOAT, want
        scope.made[(name, want)] = target
        return target

    def retype(self, scope: Scope, io_wide: bool) -> None:
        """Make values, attributes and declared types narrow where the domain says so."""
        plan = self.plan
        for name, init in scope.inits.items():
            if plan.is_float(name) and plan.domain.get(name) == NARROW:
                init.CopyFrom(narrow_tensor(numpy_helper.to_array(init), name, plan.narrow))
        for node in scope.graph.node:
            narrow = node.output and plan.domain.get(node.output[0]) == NARROW
            if narrow and plan.picks_type(node):
                self._retarget(node)
        declared = list(scope.graph.value_info)
        if not io_wide:
            declared += list(scope.graph.input) + list(scope.graph.output)
        for vi in declared:
            tensor_type = vi.type.tensor_type
            if tensor_type.elem_type == FLOAT and plan.domain.get(vi.name) == NARROW:
                tensor_type.elem_type = plan.narrow

    def _retarget(self, node) -> None:
        """Point a type-picking node (Constant, Cast, ConstantOfShape, Random*...) at narrow."""
        narrow = self.plan.narrow
        if node.op_type == "Constant":
            value = constant_value(node)
            del node.attribute[:]
            node.attribute.append(
                helper.make_attribute("value", narrow_tensor(value, "value", narrow))
            )
            return
        attr_name, _ = TYPE_ATTR[node.op_type]
        kept = [a for a in node.attribute if a.name != attr_name]
        if attr_name == "value":
            old = next((a.t for a in node.attribute if a.name == "value"), None)
            value = numpy_helper.to_array(old) if old is not None else np.zeros(1, np.float32)
            new = helper.make_attribute("value", narrow_tensor(value, "value", narrow))
        else:
            new = helper.make_attribute(attr_name, narrow)
        del node.attribute[:]
        node.attribute.extend([*kept, new])
