"""What a packed call costs an engine that builds what it runs (issue 39): TensorRT's build time
follows the network it builds, not the number of calls. Owns two estimates and what they drive:

- the estimate of record, :data:`ESTIMATE` (a :class:`HeavyLayerCost`): seconds ≈ a per call +
  b per *heavy layer* built (a call of light layers only: a smaller fixed part + a little per node) — convolutions, matrix multiplies, softmax, normalization, the layers
  whose kernels the builder chooses among many (TensorRT-RTX 1.7 on the H200, the pass/fail rows'
  157 builds, R² 0.78 where a per-node fit gets 0.23: docs/benchmark.md, "Build cost by heavy
  layers"); :func:`heavy_layers` counts them on the ONNX side, as TensorRT's parser would make them;
- the per-node fit :data:`TENSORRT` (a :class:`BuildCost`, the H100's builds), which
  ``--pack-by build-cost`` (the default on trt targets) still follows: whether a speculative member
  (a rider) is worth its build, and how many candidate nodes one call of a sequence that stops at
  its first hit holds (docs/benchmark.md says why the policy did not switch).

Runs no engine, reads no file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reprokit.spec import parse_target


@dataclass(frozen=True)
class BuildCost:
    """seconds ≈ ``per_call_s``·calls + ``per_node_s``·nodes built."""

    per_call_s: float
    per_node_s: float

    def seconds(self, calls: int, nodes: int) -> float:
        return self.per_call_s * calls + self.per_node_s * nodes

    def rider_pays(self, nodes: int, chance: float) -> bool:
        """A speculative member of ``nodes`` nodes that a later step needs with probability
        ``chance``: riding now saves that later call's fixed cost when it is needed, and builds
        its nodes for nothing when it is not (when needed they are built either way)."""
        return chance * self.per_call_s >= (1 - chance) * self.per_node_s * nodes

    def chunk_nodes(self, total: int, calls: int | None = None) -> int:
        """Candidate nodes per call for a sequence of ``total`` nodes judged in order until the
        first hit, the hit equally likely anywhere: chunks of k nodes cost about
        per_call·total/(2k) + per_node·(total + k)/2 on average, least at k = √(total·per_call/per_node).
        (One pack of everything builds every node; chunks of one node pay a call each.)
        ``calls``: at most this many chunks (what the run's call budget leaves the sequence)."""
        best = max(1, round(math.sqrt(max(1, total) * self.per_call_s / self.per_node_s)))
        return best if calls is None else max(best, -(-total // max(1, calls)))

    def chunks(self, total: int, calls: int | None = None) -> tuple[int, bool]:
        """(the first chunk's candidate nodes, whether each next chunk doubles) for a sequence of
        ``total`` nodes judged until its first hit in at most ``calls`` chunks. The first chunk of
        :meth:`chunk_nodes`, each next one doubling (about log2 of total/first chunks): a hit
        early in the order — births first, pairs likeliest first, rungs smallest first — costs one
        small chunk (PP-OCRv4 rec's pairs: 230 nodes built for the 11th pair), and a sequence
        without a hit costs log2 calls, not total/first: by the estimate of record a call's fixed
        part is worth ~7 heavy layers, about what one first-size chunk holds, so a chunk of
        that size per call paid the builder twice (PP-OCRv4 det under openvino:bf16: the survey's
        330 singles 9 -> 4 calls, the same heavy layers built). Where even doubling needs more
        calls than ``calls``, chunks of total/calls."""
        best = self.chunk_nodes(total)
        if calls is None or math.ceil(math.log2(total / best + 1)) <= calls:
            return best, total > best
        return self.chunk_nodes(total, calls), False


# TensorRT-RTX 1.7.1.116 on an H100, fp32, strongly typed (bench/results/buildcost/rtx_h100.jsonl,
# bench/trt_buildcost_fit.py): a one-node build 13.5 ms (median of 72), then 3.07 ms a node.
# Full TensorRT adds tactic timing per distinct layer configuration, which the run's shared
# timing cache pays once; its per-node part is larger too, its ratio of the two unmeasured.
TENSORRT = BuildCost(per_call_s=0.0135, per_node_s=0.00307)


@dataclass(frozen=True)
class HeavyLayerCost:
    """A call holding heavy layers (:func:`heavy_layers`): ``per_call_s`` + ``per_heavy_s``·heavy;
    a call of light layers only: ``per_light_call_s`` + ``per_light_node_s``·its nodes. Linear in
    the run's totals, so a run's estimate needs its calls, the heavy layers its models held
    (summary.json's ``build_work.heavy_built``, bench/count_check.py's log) and, where known, which
    calls held none and their nodes."""

    per_call_s: float
    per_heavy_s: float
    per_light_call_s: float
    per_light_node_s: float

    def call_seconds(self, nodes: int, heavy: int) -> float:
        """One call's build of a model of ``nodes`` nodes, ``heavy`` of them heavy layers."""
        if heavy:
            return self.per_call_s + self.per_heavy_s * heavy
        return self.per_light_call_s + self.per_light_node_s * nodes

    def seconds(self, calls: int, heavy: int, light_calls: int = 0, light_nodes: int = 0) -> float:
        """A run's ``calls`` holding ``heavy`` heavy layers in all; ``light_calls`` of them held
        none (``light_nodes`` nodes in all). Where which calls were light is not known (0), every
        call is priced as one holding heavy layers."""
        return (
            self.per_call_s * (calls - light_calls)
            + self.per_heavy_s * heavy
            + self.per_light_call_s * light_calls
            + self.per_light_node_s * light_nodes
        )


# TensorRT-RTX 1.7.1.116 on an H200, fp32, strongly typed, built for SM 8.9
# (bench/results/buildcost/rtx_h200_passfail.jsonl, bench/trt_buildcost_fit.py --compare): least
# squares over 157 builds, every call both tools made on six pass/fail rows and the exports as given
# and folded. Calls holding heavy layers: 0.047 s + 6.35 ms a heavy layer (the fit over all 157);
# calls of light layers only (49 builds; the chain's, the toy rows'): 23.4 ms + 0.242 ms a node,
# their own fit — median error on them 33% (H200) and 75% (H100) where one intercept for every
# call gave 46% and 248%, the heavy calls' prices unchanged (the joint fit with a light intercept,
# 0.036 + 0.021·[heavy > 0] + 6.08 ms·heavy, is worse on the H100's heavy calls).
# The H100's builds (rtx_h100.jsonl) follow no one line with these: its small builds take a
# third of what this says (median predicted ÷ measured 2.7 under 20 heavy layers), its builds of
# 20-150 heavy layers 0.80, its survey packs (130-400 heavy layers, hundreds of outputs) cost
# 13-25 ms a layer, more with more outputs: 2-4 times this estimate (docs/benchmark.md).
ESTIMATE = HeavyLayerCost(
    per_call_s=0.0470, per_heavy_s=0.00635, per_light_call_s=0.0234, per_light_node_s=0.000242
)

# ONNX operators whose TensorRT layer is a heavy one, by the layer kind: what the H200 fit
# counts. Measured alone (bench/results/buildcost/rtx_h100.md's singles) Conv, ConvTranspose,
# MatMul and Gemm build in 45-55 ms, the light ones in 11-15 ms. Left out: BatchNormalization
# (a SCALE layer alone, fused into the Conv before it), Reduce* and GlobalAveragePool (REDUCE:
# 11-14 ms alone, and the fit without them is as good on both machines), pooling, elementwise.
HEAVY_BY_KIND = {
    "CONVOLUTION": ("Conv", "ConvInteger", "QLinearConv"),
    "DECONVOLUTION": ("ConvTranspose",),
    "MATRIX_MULTIPLY": ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul"),
    "SOFTMAX": ("Softmax", "LogSoftmax"),
    "NORMALIZATION": ("LayerNormalization", "InstanceNormalization", "GroupNormalization"),
}
HEAVY_OPS = frozenset(op for ops in HEAVY_BY_KIND.values() for op in ops)
# Their outputs are known when the engine is built (static shapes, which every trt call has).
_SHAPE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})


def heavy_layers(model) -> int:
    """Heavy layers (:data:`HEAVY_OPS`) a TensorRT build of ``model`` (a ModelProto) makes, If/Loop
    bodies included. A node whose every input is known at build time (initializers, Constant
    nodes, shapes, and what only those feed) is folded into a weight, not built: a MatMul of two
    initializers costs nothing. Pure: reads the proto, runs nothing."""
    graph = model.graph
    known = {t.name for t in graph.initializer} | {""}
    return _heavy_in(graph, known)


def _heavy_in(graph, known: set) -> int:
    known = known | {t.name for t in graph.initializer}
    heavy = 0
    for node in graph.node:
        bodies = [a.g for a in node.attribute if a.HasField("g")] + [
            g for a in node.attribute for g in a.graphs
        ]
        for body in bodies:  # outer tensors a body reads keep what is known of them
            heavy += _heavy_in(body, known)
        if bodies:
            continue
        if node.op_type in _SHAPE_OPS or all(name in known for name in node.input):
            known.update(node.output)
        elif node.op_type in HEAVY_OPS:
            heavy += 1
    return heavy


# How likely a rider is to be asked about later: unknown in general, so even odds. At the
# measured TensorRT costs a rider then pays up to 4 nodes (a shape crop, a producer→consumer
# pair), never a 100-node drift window.
RIDER_CHANCE = 0.5


def for_target(target: str) -> BuildCost | None:
    """The build-cost model of ``target``'s engine; None for engines whose cost is the call
    itself (the emulator, onnxruntime, OpenVINO on the CPU: riders there cost memory, which the
    pack bounds already govern)."""
    return TENSORRT if parse_target(target).engine == "trt" else None


PACK_BY = ("auto", "build-cost", "count")


def policy(pack_by: str, target: str) -> BuildCost | None:
    """The cost model packs follow (``--pack-by``): None packs by count (as few calls as the pack
    limits allow); a BuildCost packs by estimated build seconds. ``auto``: by build cost where the
    engine builds what it runs (trt), by count elsewhere. ``build-cost`` on another engine runs the
    TensorRT policy there (the benchmark's estimate of TensorRT build seconds, bench/bench_shrink.py)."""
    if pack_by not in PACK_BY:
        raise ValueError(f"pack_by must be one of {PACK_BY}, not {pack_by!r}")
    if pack_by == "count":
        return None
    return TENSORRT if pack_by == "build-cost" else for_target(target)
