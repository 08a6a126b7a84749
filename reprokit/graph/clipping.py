"""What a QuantizeLinear clips, as ONNX facts: the activation a Q/DQ pair took the place of
(``fused_activation``: onnxruntime's quantizer removes a Relu/Clip whose range the pair's
saturation holds, and leaves the Clip's bounds behind: ``clip_bounds``), and on given
activations the share of each QuantizeLinear's input outside its representable range
(``clipping``), where calibration — not the model — clips.

Must not run engines or judge verdicts. ``quant.py`` (the fp32 twin puts the removed clamps back)
imports these names and hands them on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reprokit.graph.qtypes import (
    DQ,
    FLOAT8,
    Q,
    constant_value,
    element_type,
    float8_spacing,
    q_range,
)

__all__ = ["Clipping", "clip_bounds", "clipping", "fused_activation"]


def fused_activation(model, node) -> str | None:
    """ "Relu" or "Clip" when the QuantizeLinear ``node`` took the place of that activation:
    onnxruntime's quantizer removes a Relu/Clip whose range the Q/DQ pair's saturation holds and
    gives the activation's output name to what fed it (a Conv writes ``…/Clip_output_0``), or
    names the Q after the removed output. Its clipping below the range (Relu) or on both sides
    (Clip) is the model's, not calibration's."""
    if node.op_type != Q:
        return None
    producer = next((n.op_type for n in model.graph.node if node.input[0] in n.output), None)
    if producer in ("Relu", "Clip"):
        return None
    names = [node.input[0]]
    if node.name.endswith("_QuantizeLinear"):
        names.append(node.name[: -len("_QuantizeLinear")])
    for name in names:
        last = name.rsplit("/", 1)[-1].lower()
        if "clip" in last:
            return "Clip"
        if "relu" in last:
            return "Relu"
    return None


def clip_bounds(model, q) -> tuple[float, float] | None:
    """The bounds of the Clip onnxruntime's quantizer removed in front of ``q``: it leaves the
    Clip's min/max behind, unread, as scalar initializers or Constant nodes in the Clip's scope
    (``…/activation/``); None when there are not exactly two."""
    from onnx import numpy_helper

    scope = q.input[0].rsplit("/", 1)[0] + "/"
    read = {name for n in model.graph.node for name in n.input}
    tensors = [
        t for t in model.graph.initializer if t.name.startswith(scope) and t.name not in read
    ]
    for node in model.graph.node:
        if (
            node.op_type == "Constant"
            and node.output[0].startswith(scope)
            and node.output[0] not in read
        ):
            tensors += [a.t for a in node.attribute if a.name == "value"]
    found = [float(numpy_helper.to_array(t)) for t in tensors if not t.dims and t.data_type == 1]
    return (min(found), max(found)) if len(found) == 2 else None


@dataclass(frozen=True)
class Clipping:
    """What one QuantizeLinear clips on one run: the share of its input outside the range its
    scale and zero point can represent, and how far past it the input reaches."""

    node: str  # the QuantizeLinear's name
    tensor: str  # its input
    clipped: float  # share of elements outside [lo, hi]
    lo: float
    hi: float
    seen_min: float
    seen_max: float
    reader_ops: tuple[str, ...]  # names of the float nodes that read the dequantized value
    # the float node that computes the clipped tensor ("" for a graph input): onnxruntime's
    # quantizer also quantizes a quantized op's output, so excluding the readers alone leaves the pair
    producer: str = ""

    @property
    def widen_by(self) -> float:
        """How many times wider the calibrated range must be to hold every value seen."""
        over = self.seen_max / self.hi if self.hi > 0 and self.seen_max > self.hi else 1.0
        under = self.seen_min / self.lo if self.lo < 0 and self.seen_min < self.lo else 1.0
        return max(over, under, 1.0) if (self.hi > 0 or self.lo < 0) else float("inf")


def clipping(model, index, values) -> list[Clipping]:
    """Every QuantizeLinear whose input (``values``: tensor → array, e.g. the reference
    capture) holds values outside its representable range, most clipped first. A pair that took
    the place of a Relu counts only the values above its range; one that took a Clip's, none."""
    found = []
    for node in model.graph.node:
        if node.op_type != Q or node.input[0] not in values or len(node.input) < 2:
            continue
        if constant_value(model, index, node.input[1]) is None:
            continue
        fused = fused_activation(model, node)
        x = np.asarray(values[node.input[0]], np.float32)
        # a pair in a removed activation's place: what the activation itself clamps is the model's
        if fused == "Clip":
            bounds = clip_bounds(model, node)
            if bounds is None:
                continue  # the Clip's own bounds are gone: its clipping cannot be told from calibration's
            x = np.clip(x, *bounds)
        elif fused == "Relu":
            x = np.maximum(x, 0)
        lo, hi = q_range(model, index, node, x.ndim)
        kind = element_type(model, index, node)
        # half a step at the range's edge: rounding, not clipping (FP8's grid is widest there)
        half = (
            hi / FLOAT8[kind][0] * float8_spacing(kind, FLOAT8[kind][0]) / 2
            if kind in FLOAT8
            else (hi - lo) / 255 / 2
        )
        outside = (x > hi + half) | (x < lo - half)
        share = float(np.mean(outside)) if x.size else 0.0
        if share > 0:
            readers = tuple(
                model.graph.node[r].name
                for dq in index.consumers.get(node.output[0], ())
                for out in index.node_outputs[dq]
                for r in index.consumers.get(out, ())
            )
            source = index.producer.get(node.input[0])
            made_by = model.graph.node[source] if source is not None else None
            producer = (
                made_by.name
                if made_by is not None and made_by.op_type not in (Q, DQ, "Constant")
                else ""
            )
            seen_min = float(np.min(x))
            found.append(
                Clipping(
                    node.name,
                    node.input[0],
                    share,
                    float(np.min(lo)),
                    float(np.max(hi)),
                    seen_min,
                    float(np.max(x)),
                    readers,
                    producer,
                )
            )
    return sorted(found, key=lambda c: -c.clipped)
